"""The localizer HTTP service (aiohttp): JSON under /v1/, bearer-token auth, size limit, sessions.

Every request except ``GET /v1/healthz`` needs ``Authorization: Bearer <token>`` (401 otherwise).
Bodies over ``max_body_bytes`` get 413 before they are read. Bodies are JSON; patterns also come
as zlib-compressed JSON (``application/x-perftracker-patterns+zlib``, inflated with a bound) or, one
upload per node, in the columnar form (``application/x-perftracker-columns``,
``perftracker.wire.patterns``), validated with numpy and kept as arrays (``perftracker.localizer.service.columns``);
JSON goes through the request schemas in ``perftracker.localizer.service.validate`` and the model's ``from_dict``. Nothing from
the network is ever unpickled. Errors are JSON ``{"error": message}`` with a 4xx status. The
middlewares and body decoding are ``perftracker.localizer.service.http_io``; this module holds the app, its lifecycle
(startup, the deadline checker, cleanup) and the request handlers; the read-only ones are its part
``queries`` (``perftracker.localizer.service.query_handlers.QueryHandlers``).

An upload is acknowledged only after the store committed it. Localization runs in a one-thread
executor (``perftracker.localizer.service.localize_runner``) so that the event loop keeps answering while a session is localized.

In a Kubernetes pod (``perftracker.localizer.k8s.client.from_environment()``, looked up once at startup; None and a
no-op elsewhere) a new session also expects the ranks of the job's pods, merged with the
registrations, and every stored report is posted as Warning Events on the pods of the ranks it
names (``perftracker.localizer.k8s.cluster``). Both API calls run on a one-thread "k8s" executor, never on the
event loop; a failed pod listing is logged and the session keeps the registrations' ranks. The
store's writer thread is ``perftracker.localizer.store.writer.GroupCommit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from perftracker.localizer.k8s.client import KubernetesClient, from_environment
from perftracker.localizer.k8s.cluster import ClusterLink
from perftracker.localizer.service.bounds import check_hang_snapshot
from perftracker.localizer.service.connections import ConnectionGuard, GuardedSite, raise_fd_limit
from perftracker.localizer.service.http_io import (
    HEALTHZ,
    SCOPE,
    TENANT,
    auth_middleware,
    check_scope,
    decode_patterns,
    errors_middleware,
    json_response,
    read_body,
    read_json,
    token_id,
)
from perftracker.localizer.service.localize_runner import LocalizeRunner, Uploaded
from perftracker.localizer.service.ownership import AGENT_KEY_HEADER
from perftracker.localizer.service.query_handlers import QueryHandlers
from perftracker.localizer.service.retention import Plan, Retention, RetentionOptions
from perftracker.localizer.service.service_metrics import install as install_metrics
from perftracker.localizer.service.session.manager import SessionManager
from perftracker.localizer.service.session.options import SessionOptions
from perftracker.localizer.service.tokens import check_token, job_allowed
from perftracker.localizer.service.validate import (
    RequestError,
    parse_heartbeat,
    parse_name,
    parse_registration,
    parse_timeout,
    parse_trigger,
    validate_expect_file,
)
from perftracker.localizer.store.sqlite_store import SessionRecord, Store

from perftracker.clock import Clock
from perftracker.errors import ConfigError, PerftrackerError
from perftracker.model import HangSnapshot

log = logging.getLogger(__name__)

API_VERSION = 1


@dataclass(frozen=True)
class ServiceOptions:
    max_body_bytes: int = 2 * 1024 * 1024  # on the wire
    max_inflated_bytes: int = 8 * 1024 * 1024  # after zlib (a parsed set is ~2.5x its JSON)
    max_poll_s: float = 60.0  # longest long poll
    check_interval_s: float = 0.25  # how often deadlines are checked
    report_dir: str | None = None  # also write each report as <report_dir>/<session>.json
    expect_path: str | None = None  # expected ranges (TOML, --expect FILE); None: the built-in profiles
    kubernetes: bool = True  # look for an in-cluster Kubernetes API at startup (no-op outside a pod)
    k8s_lookup_wait_s: float = 5.0  # a trigger's answer waits this long for the pod listing
    # slow and idle clients (perftracker.localizer.service.connections): request headers must arrive this soon after
    # connecting, a body this soon after its headers; an idle keep-alive connection closes after
    # keepalive_timeout_s; at most max_connections are open (None: RLIMIT_NOFILE minus a reserve)
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 15.0
    max_connections: int | None = None
    max_uploads_in_flight: int = 64  # uploads read, parsed and committed at once (memory bound)
    # TLS for agent <-> localizer (docs/security.md): PEM certificate chain and private key
    tls_cert: str | None = None
    tls_key: str | None = None
    # tokens limited to jobs: {token: (job glob, ...)} (perftracker.localizer.service.tokens, docs/security.md)
    job_tokens: dict[str, tuple[str, ...]] = field(default_factory=dict)
    sessions: SessionOptions = field(default_factory=SessionOptions)
    # closed sessions and report files expire by age and total size (perftracker.localizer.service.retention)
    retention: RetentionOptions = field(default_factory=RetentionOptions)


class LocalizerService:
    """The aiohttp application and its background deadline checker."""

    def __init__(self, store: Store, token: str, options: ServiceOptions | None = None,
                 clock: Clock | None = None, localize_options: object | None = None,
                 k8s_client: KubernetesClient | None = None) -> None:
        """``k8s_client``: a Kubernetes client to use; None: ``from_environment()`` at startup
        (when ``options.kubernetes``). Raises ConfigError for a bad ``options.expect_path``."""
        if not token:
            raise PerftrackerError("the localizer needs a bearer token (--token, PERFTRACKER_TOKEN or a token file)")
        token = check_token(token)  # ConfigError for a short or placeholder token
        self.store = store
        self.options = options or ServiceOptions()
        self.sessions = SessionManager(store, clock, self.options.sessions)
        self.queries = QueryHandlers(store, self._session_dict, self._summary_dict)  # the read-only GETs
        if self.options.expect_path is not None:
            validate_expect_file(self.options.expect_path)
        self.k8s: KubernetesClient | None = k8s_client
        self._token = token.encode()
        # the localize thread, and the only thread that writes the store (after each commit it
        # starts the localizations that became due)
        self.localize_runner = LocalizeRunner(self.sessions, store.run_batch, localize_options,
                                     self.options.expect_path, self.options.report_dir)
        self._writer = self.localize_runner.writer
        self.retention = Retention(store, self.options.report_dir, self.options.retention,
                                   tenant_of=tenant_of_job(self.options.job_tokens))
        self._sweeper: asyncio.Task[None] | None = None
        self._waiters: dict[str, asyncio.Event] = {}
        self._checker: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.guard: ConnectionGuard | None = None
        self._upload_slots: asyncio.Semaphore | None = None  # made on the service's loop
        self.app = self._build_app()
        self.metrics = install_metrics(self)  # GET /metrics (perftracker.localizer.service.service_metrics)

    @property
    def cluster(self) -> ClusterLink | None:
        """The Kubernetes side, set at startup when there is a Kubernetes client."""
        return self.localize_runner.cluster

    def report_path(self, session: str) -> Path | None:
        return self.localize_runner.report_path(session)

    # ---------------------------------------------------------------- app
    def _build_app(self) -> web.Application:
        max_body = self.options.max_body_bytes
        app = web.Application(middlewares=[errors_middleware(max_body), auth_middleware(self._token, max_body,
                                                                                   self.options.job_tokens)],
                              client_max_size=max_body)
        r = app.router
        r.add_get(HEALTHZ, self.healthz)
        r.add_post("/v1/agents/register", self.register)
        r.add_post("/v1/heartbeat", self.heartbeat)
        r.add_get("/v1/jobs", self.jobs)
        r.add_get("/v1/jobs/{job}/triggers", self.poll_trigger)
        r.add_post("/v1/jobs/{job}/triggers", self.create_trigger)
        r.add_post("/v1/sessions/{session}/patterns", self.upload_patterns)
        r.add_post("/v1/hang-snapshots", self.upload_hang_snapshot)
        r.add_get("/v1/sessions", self.queries.list_sessions)
        r.add_get("/v1/sessions/{session}", self.queries.get_session)
        r.add_get("/v1/sessions/{session}/report", self.queries.get_report)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _write(self, fn: Callable[[], Any]) -> Any:
        """Run a store-writing call on the writer thread, batched with concurrent ones; returns once
        committed. Every write goes through here, so the event loop never waits for an fsync."""
        return await self._writer.submit(fn)

    def _wake(self, job: str) -> None:
        ev = self._waiters.pop(job, None)
        if ev is not None:
            ev.set()

    # ---------------------------------------------------------------- lifecycle
    async def _on_startup(self, app: web.Application) -> None:
        self.sessions.recover()
        loop = asyncio.get_running_loop()
        if self.k8s is None and self.options.kubernetes:
            self.k8s = await asyncio.to_thread(from_environment)
        if self.k8s is not None:
            self.localize_runner.cluster = ClusterLink(self.k8s, self.store, self._writer)
        self.localize_runner.warm()
        self._checker = loop.create_task(self._check_deadlines())
        self._sweeper = loop.create_task(self._sweep_periodically())

    async def _on_cleanup(self, app: web.Application) -> None:
        for task in (self._checker, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for ev in self._waiters.values():
            ev.set()
        # a localization in progress finishes (its writes go through the writer, closed after it)
        await asyncio.to_thread(self.localize_runner.close)
        if self.cluster is not None:  # its lookups write through the writer: close that last
            await asyncio.to_thread(self.cluster.close)
        await asyncio.to_thread(self._writer.close)

    async def _check_deadlines(self) -> None:
        while True:
            try:
                for s in self.sessions.due():
                    self.localize_runner.schedule(s.session)
            except Exception:  # noqa: BLE001 - keep checking
                log.exception("deadline check failed")
            await asyncio.sleep(self.options.check_interval_s)

    async def sweep(self) -> Plan:
        """One retention sweep: weighed on a worker thread, rows deleted through the writer in
        chunks, report files removed on a worker thread. The event loop only awaits."""
        plan = await asyncio.to_thread(self.retention.plan, self.sessions.clock.now_ns())
        chunk = self.options.retention.chunk
        for i in range(0, len(plan.sessions), chunk):
            part = plan.sessions[i:i + chunk]
            await self._write(lambda part=part: self.store.delete_sessions(part))  # type: ignore[misc]
        if plan.sessions or plan.orphan_files:
            await asyncio.to_thread(self.retention.remove_files, plan.sessions, plan.orphan_files)
            log.info("retention: deleted %d session(s) older than %.0f days and %d more past %.0f MiB "
                     "(%.1f -> %.1f MiB), %d orphan report file(s)", len(plan.expired),
                     self.options.retention.max_age_s / 86400, len(plan.evicted),
                     self.options.retention.max_bytes / 2**20, plan.total_bytes / 2**20, plan.kept_bytes / 2**20,
                     len(plan.orphan_files))
        return plan

    async def _sweep_periodically(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:  # noqa: BLE001 - keep sweeping
                log.exception("retention sweep failed")
            await asyncio.sleep(self.options.retention.interval_s)

    def _session_dict(self, s: SessionRecord) -> dict[str, Any]:
        d = s.to_dict()
        path = self.report_path(s.session)
        d["report_path"] = str(path) if path is not None and s.state == "done" else None
        return d

    def _summary_dict(self, s: SessionRecord) -> dict[str, Any]:
        d = s.summary_dict()
        path = self.report_path(s.session)
        d["report_path"] = str(path) if path is not None and s.state == "done" else None
        return d

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Start listening; returns the bound port."""
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self.options.keepalive_timeout_s)
        await self._runner.setup()
        site = GuardedSite(self._runner, host, port, ssl_context=self._ssl_context(),
                           guard_options={"header_timeout_s": self.options.header_timeout_s,
                                          "max_connections": self.options.max_connections})
        await site.start()
        self.guard = site.guard
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def add_site(self, host: str, port: int = 0) -> int:
        """Listen on one more address (after ``start``), with the same guard options; the bound port.
        A job served to other nodes (issue 42) gets its own site on the job's interface."""
        if self._runner is None:
            raise PerftrackerError("the localizer service is not started")
        site = GuardedSite(self._runner, host, port, ssl_context=self._ssl_context(),
                           guard_options={"header_timeout_s": self.options.header_timeout_s,
                                          "max_connections": self.options.max_connections})
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    def grant_job(self, token: str, job: str) -> None:
        """Let ``token`` (at least MIN_TOKEN_CHARS, random) read and write ``job`` only, from now on."""
        check_token(token, what="the job's token")
        self.options.job_tokens[token] = (job,)

    def _ssl_context(self) -> ssl.SSLContext | None:
        o = self.options
        if not o.tls_cert and not o.tls_key:
            return None
        if not (o.tls_cert and o.tls_key):
            raise ConfigError("TLS needs both a certificate (--tls-cert) and its key (--tls-key)")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(o.tls_cert, o.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"TLS certificate {o.tls_cert} / key {o.tls_key}: cannot load ({exc})") from None
        return ctx

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---------------------------------------------------------------- handlers
    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"ok": True, "api_version": API_VERSION,
                                  "localizing": len(self.localize_runner.localizing)})

    async def register(self, request: web.Request) -> web.Response:
        reg = parse_registration(await read_json(request, self.options.body_timeout_s))
        check_scope(request, reg.job)
        key = request.headers.get(AGENT_KEY_HEADER)
        grown, issued = await self._write(lambda: self.sessions.register_agent(reg, key))
        trig = self.sessions.next_trigger(reg.job)
        body = {"ok": True, "job": reg.job, "agent_id": reg.agent_id, "ranks": [w.rank for w in reg.workers],
                "sessions_grown": grown, "open_session": trig.to_dict() if trig else None}
        if issued:
            body["agent_key"] = issued  # the agent presents it from now on (perftracker.localizer.service.ownership)
        return json_response(body)

    async def heartbeat(self, request: web.Request) -> web.Response:
        hb = parse_heartbeat(await read_json(request, self.options.body_timeout_s))
        check_scope(request, hb.job)
        key = request.headers.get(AGENT_KEY_HEADER)
        await self._write(lambda: self.sessions.heartbeat(hb, key))
        return json_response({"ok": True})

    async def jobs(self, request: web.Request) -> web.Response:
        scope = request.get(SCOPE)
        jobs = await asyncio.to_thread(self.store.jobs)  # read off the event loop, like every listing
        return json_response({"jobs": [j for j in jobs if job_allowed(scope, j)]})

    async def poll_trigger(self, request: web.Request) -> web.StreamResponse:
        job = parse_name(request.match_info["job"], "job")
        check_scope(request, job)
        after = request.query.get("after") or None
        if after is not None:
            after = parse_name(after, "after")
        timeout_s = parse_timeout(request.query.get("timeout_s"), self.options.max_poll_s)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while True:
            ev = self._waiters.setdefault(job, asyncio.Event())
            trig = self.sessions.next_trigger(job, after)
            if trig is not None:
                return json_response(trig.to_dict())
            left = end - loop.time()
            if left <= 0:
                return web.Response(status=204)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ev.wait(), left)

    async def create_trigger(self, request: web.Request) -> web.Response:
        job = parse_name(request.match_info["job"], "job")
        check_scope(request, job)
        req = parse_trigger(await read_json(request, self.options.body_timeout_s))
        kind = "hang" if req.reason.startswith("hang") else "slowdown"
        quota = _quota_key(request)  # a job-scoped token's triggers count against that token
        s, joined = await self._write(lambda: self.sessions.trigger(job, req.reason, req.window_s, kind=kind,
                                                                    quota_key=quota, detection=req.detection))
        self._wake(job)
        if not joined and s.state == "done":  # settled by the first look: no window, its report is stored
            await asyncio.to_thread(self.localize_runner.settled, s.session)
        lookup = self.cluster.expect_pods(s) if self.cluster is not None else None
        if lookup is not None:  # answer with the pods' ranks too, unless the API server is slow
            try:
                merged = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(lookup)),
                                                self.options.k8s_lookup_wait_s)
            except TimeoutError:
                merged = None
            s = merged or s
        # the expected ranks as a count and ranges: the answer's size does not grow with the world size
        return json_response({"session": s.session, "joined": joined, "window_s": s.window_s,
                              "reason": s.reason, "kind": s.kind, "n_expected": len(s.expected),
                              "expected_ranges": s.expected.to_json()[:64]},
                             status=200 if joined else 201)

    async def upload_patterns(self, request: web.Request) -> web.Response:
        """At most ``max_uploads_in_flight`` uploads are read, parsed and committed at once; the
        others wait with their bodies still in the kernel's socket buffers (bounded memory when
        thousands of agents upload together)."""
        if self._upload_slots is None:
            self._upload_slots = asyncio.Semaphore(self.options.max_uploads_in_flight)
        async with self._upload_slots:
            return await self._upload_patterns(request)

    async def _upload_patterns(self, request: web.Request) -> web.Response:
        """One PatternSet (JSON) or one node's ranks (columnar), parsed once here into arrays."""
        session = parse_name(request.match_info["session"], "session")
        raw = await read_body(request, self.options.body_timeout_s)
        batch, body = decode_patterns(request.content_type, raw, self.options.max_inflated_bytes)
        check_scope(request, batch.job)
        if batch.session != session:
            raise RequestError(f"PatternSet.session {batch.session!r} does not match the URL's session {session!r}",
                               status=422)
        self.sessions.check_batch(batch)
        self.sessions.ownership.check_ranks_writer(batch.job, batch.ranks, request.headers.get(AGENT_KEY_HEADER))
        # committed (group commit: one transaction and fsync for concurrent uploads) before we answer.
        # The writer is FIFO and commit_batches re-checks the session inside the transaction, so an
        # upload queued before the session starts localizing is in the report, and one after gets 409.
        def commit() -> Uploaded:
            self.sessions.commit_batches([(batch, body)])
            return Uploaded(session)

        await self._write(commit)
        s, n_uploaded = self.sessions.upload_counts(session)
        if s.state == "open" and self.sessions.is_complete(s):
            self.localize_runner.schedule(s.session)
        ranks = batch.ranks
        return json_response({"ok": True, "session": s.session, "rank": ranks[0], "ranks": ranks, "stored": True,
                              "uploaded": n_uploaded, "expected": len(s.expected)})

    async def upload_hang_snapshot(self, request: web.Request) -> web.Response:
        d = await read_json(request, self.options.body_timeout_s)
        try:
            snap = HangSnapshot.from_dict(d)
        except (TypeError, ValueError, AttributeError) as exc:
            raise RequestError(f"HangSnapshot: bad shape ({exc})", status=422) from None
        parse_name(snap.job, "job")
        check_scope(request, snap.job)
        check_hang_snapshot(snap, self.sessions.world_of(snap.job))  # its integers, against the job's world
        self.sessions.ownership.check_rank_writer(snap.job, snap.rank, request.headers.get(AGENT_KEY_HEADER))
        quota = _quota_key(request)  # a snapshot that opens a session counts as a trigger (issue 46)
        s = await self._write(lambda: self.sessions.accept_hang_snapshot(snap, quota_key=quota))
        self._wake(snap.job)
        if self.cluster is not None:  # a snapshot may have opened the session; not awaited
            self.cluster.expect_pods(s)
        if self.sessions.is_complete(s):
            self.localize_runner.schedule(s.session)
        return json_response({"ok": True, "session": s.session, "rank": snap.rank, "kind": s.kind})


def _quota_key(request: web.Request) -> str | None:
    """Whose quota a session this request opens counts against: its job-scoped token (each token
    its own, named by a hash, with its globs for the message), None for the main token (the job's)."""
    scope, tenant = request.get(SCOPE), request.get(TENANT)
    return f"{tenant} (for {', '.join(scope)[:80]!r})" if scope is not None and tenant else None


def tenant_of_job(job_tokens: Mapping[str, tuple[str, ...]]) -> Callable[[str], str]:
    """job -> its tenant for retention: the job-scoped token that names it (the first by its id),
    else "main" (jobs only the main token writes)."""
    def tenant(job: str) -> str:
        ids = sorted(token_id(t) for t, scope in list(job_tokens.items()) if job_allowed(scope, job))
        return ids[0] if ids else "main"

    return tenant


def run_service(host: str, port: int, store_path: str | Path, token: str, options: ServiceOptions | None = None,
                on_ready: Callable[[str], None] | None = None) -> None:
    """Run the service until SIGINT/SIGTERM. ``on_ready(url)`` is called once it listens."""

    async def main() -> None:
        raise_fd_limit()  # as many connections as the hard limit allows (the cap stays below it)
        store = Store(store_path)
        service = LocalizerService(store, token, options)
        bound = await service.start(host, port)
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{bound}"
        log.info("localizer listening on %s (store %s)", url, store_path)
        if on_ready is not None:
            on_ready(url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await service.stop()
            store.close()

    asyncio.run(main())
