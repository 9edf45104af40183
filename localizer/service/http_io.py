"""The localizer service's HTTP plumbing: error responses, the error and auth middlewares, bodies.

Errors are JSON ``{"error": message}`` with a 4xx status (5xx for store and internal errors, which
are logged). Every request except ``GET /v1/healthz`` needs ``Authorization: Bearer <token>`` (401
otherwise); a declared body over ``max_body_bytes`` gets 413 before it is read. Bodies are JSON, or
zlib-compressed JSON inflated with a bound; nothing from the network is ever unpickled.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web
from perftracker.localizer.service.bounds import check_pattern_set
from perftracker.localizer.service.tokens import job_allowed
from perftracker.localizer.service.validate import RequestError

from perftracker.errors import PerftrackerError, SchemaError
from perftracker.model import PatternSet
from perftracker.wire import strict_json
from perftracker.wire.patterns import (
    COLUMNS_CONTENT_TYPE,
    PatternBatch,
    WireVersionError,
    batch_from_sets,
    decode_batch,
    encode_batch,
)

log = logging.getLogger(__name__)

PATTERNS_ZLIB = "application/x-perftracker-patterns+zlib"
JSON = "application/json"
HEALTHZ = "/v1/healthz"  # the one path without auth
SCOPE: web.RequestKey[tuple[str, ...] | None] = web.RequestKey("scope", object)  # type: ignore[arg-type]
# who presented a job-scoped token: "token <12 hex of its sha256>", None for the main token. Quotas
# count per token, not per scope text (issue 46: two tokens with the same globs shared one quota)
TENANT: web.RequestKey[str | None] = web.RequestKey("tenant", object)  # type: ignore[arg-type]


def token_id(token: str) -> str:
    """A job-scoped token's name in quotas and logs: never the token itself."""
    return "token " + hashlib.sha256(token.encode()).hexdigest()[:12]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Middleware(Protocol):
    """What ``web.Application(middlewares=...)`` takes: called with named ``request`` and ``handler``."""

    def __call__(self, request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]: ...


def json_response(data: Any, status: int = 200) -> web.Response:
    """A JSON answer that strict parsers accept (no NaN/Infinity: perftracker.wire.strict_json)."""
    return web.json_response(data, status=status, dumps=strict_json.dumps)


def dumps_bytes(data: Any) -> bytes:
    """``json_response``'s body, built where the caller runs (a worker thread for big answers)."""
    return strict_json.dumps(data).encode()


def error_response(status: int, message: str, **extra: Any) -> web.Response:
    return json_response({"error": message, **extra}, status=status)


def errors_middleware(max_body_bytes: int) -> Middleware:
    """Turns what a handler raises into a JSON error response."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as exc:
            return error_response(exc.status, str(exc))
        except SchemaError as exc:
            return error_response(422, str(exc))
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, f"request body larger than {max_body_bytes} bytes")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return error_response(exc.status, exc.reason)
            raise
        except RecursionError:  # a structure too deep for some step: the request's fault
            return error_response(400, "request nested too deeply")
        except PerftrackerError as exc:  # store errors: disk full, I/O
            log.error("%s %s: %s", request.method, request.path, exc)
            return error_response(503, str(exc))
        except Exception:  # noqa: BLE001 - never let one request take the service down
            log.exception("%s %s failed", request.method, request.path)
            return error_response(500, "internal error (see the localizer log)")

    return errors


def auth_middleware(token: bytes, max_body_bytes: int,
                    job_tokens: Mapping[str, tuple[str, ...]] | None = None) -> Middleware:
    """Bearer-token check (constant time) and the declared body size limit. The main token may do
    everything (``request["scope"]`` None); a job token only its jobs (``request["scope"]`` its globs)."""
    live = job_tokens if job_tokens is not None else {}  # read per request: a job may be granted later

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == HEALTHZ:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        given_b = given.strip().encode("utf-8", "replace")
        scope: tuple[str, ...] | None = None
        tenant: str | None = None
        ok = scheme.lower() == "bearer" and hmac.compare_digest(given_b, token)
        if not ok and scheme.lower() == "bearer":
            for t, jobs in list(live.items()):
                if hmac.compare_digest(given_b, t.encode()):
                    ok, scope, tenant = True, jobs, token_id(t)
        if not ok:
            resp = error_response(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="perftracker"'
            return resp
        request[SCOPE] = scope
        request[TENANT] = tenant
        length = request.content_length
        if length is not None and length > max_body_bytes:
            return error_response(413, f"request body of {length} bytes is larger than {max_body_bytes}")
        return await handler(request)

    return auth


def check_scope(request: web.Request, job: str) -> None:
    """403 unless the request's token may touch ``job`` (perftracker.localizer.service.tokens)."""
    if not job_allowed(request.get(SCOPE), job):
        raise RequestError(f"this token may not access job {job!r}", status=403)


def parse_json(raw: bytes, what: str = "body") -> Any:
    """Strict JSON (no NaN/Infinity, no lone surrogates, bounded nesting), or a 400."""
    try:
        return strict_json.loads(raw)
    except ValueError as exc:
        raise RequestError(f"{what} is not valid JSON ({exc})") from None


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body, or 408 when it does not arrive within ``timeout_s`` (a slow client)."""
    try:
        async with asyncio.timeout(timeout_s):  # no extra task per request, unlike wait_for
            return await request.read()
    except TimeoutError:
        raise RequestError(f"request body not received within {timeout_s:g} s", status=408) from None


async def read_json(request: web.Request, timeout_s: float = 30.0) -> Any:
    return parse_json(await read_body(request, timeout_s))


def inflate_json(raw: bytes, max_inflated_bytes: int) -> Any:
    """JSON from a zlib body, inflating at most ``max_inflated_bytes`` (413 past that)."""
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(raw, max_inflated_bytes)
    except zlib.error as exc:
        raise RequestError(f"body is not zlib data ({exc})") from None
    if inflater.unconsumed_tail:
        raise RequestError(f"body inflates past {max_inflated_bytes} bytes", status=413)
    return parse_json(data, "inflated body")


def decode_patterns(content_type: str, raw: bytes, max_inflated_bytes: int) -> tuple[PatternBatch, bytes]:
    """An upload body -> (its patterns as a batch, the columnar bytes to store), by content type:
    ``application/x-perftracker-columns`` (one node's ranks, ``perftracker.wire.patterns``), or one
    PatternSet as JSON or zlib JSON (for people and tests). 415 for another content type or a
    columnar format version this localizer does not read; 422 for a bad shape; 400 for bad JSON."""
    if content_type == COLUMNS_CONTENT_TYPE:
        try:
            return decode_batch(raw, max_inflated_bytes), raw
        except WireVersionError as exc:
            raise RequestError(str(exc), status=415) from None
    if content_type == PATTERNS_ZLIB:
        d = inflate_json(raw, max_inflated_bytes)
    elif content_type in (JSON, "", "text/plain"):
        d = parse_json(raw)
    else:
        raise RequestError(f"unsupported content type {content_type!r} for patterns (use {COLUMNS_CONTENT_TYPE}, "
                           f"{PATTERNS_ZLIB} or {JSON})", status=415)
    try:
        ps = PatternSet.from_dict(d)
    except (TypeError, ValueError, AttributeError) as exc:  # shapes from_dict does not name
        raise RequestError(f"PatternSet: bad shape ({exc})", status=422) from None
    check_pattern_set(ps)  # its integers bounded before they become int64 arrays (issue 33)
    batch = batch_from_sets([ps])
    return batch, encode_batch(batch)
