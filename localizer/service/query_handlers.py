"""The localizer's read-only handlers: pages of sessions, one session, its report.

``QueryHandlers`` is a part of ``perftracker.localizer.service.http_service.LocalizerService``, which
owns it and routes the three GETs to it; it reads the store and shows sessions the service's way
(``session_dict``: the report path is the service's).

Each handler reads and serializes on a worker thread (``asyncio.to_thread``), never on the event
loop. A page of ``GET /v1/sessions`` holds at most ``MAX_PAGE`` sessions, each without its rank
lists (``SessionRecord.summary_dict``: counts and the first ranges of the missing ranks), so its
size does not grow with the world size; ``GET /v1/sessions/{session}`` has the lists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web
from perftracker.localizer.service.http_io import SCOPE, dumps_bytes, error_response, json_response
from perftracker.localizer.service.tokens import job_allowed
from perftracker.localizer.service.validate import RequestError, parse_int_param, parse_name
from perftracker.localizer.store.records import SessionRecord
from perftracker.localizer.store.sqlite_store import Store

MAX_PAGE = 1000  # sessions per page of GET /v1/sessions


class QueryHandlers:
    """GET /v1/sessions, /v1/sessions/{session} and /v1/sessions/{session}/report."""

    def __init__(self, store: Store, session_dict: Callable[[SessionRecord], dict[str, Any]],
                 summary_dict: Callable[[SessionRecord], dict[str, Any]] | None = None) -> None:
        self.store = store
        self._session_dict = session_dict
        self._summary_dict = summary_dict or (lambda s: s.summary_dict())

    async def list_sessions(self, request: web.Request) -> web.Response:
        """A page of sessions: ``?job=&state=&limit=`` (at most 1000), oldest first after ``after``
        (a ``seq``), or with ``order=desc`` newest first before ``before``. ``next`` is the cursor of
        the next page (None on the last): pass it as ``after`` (or ``before``)."""
        q = request.query
        job = q.get("job") or None
        if job is not None:
            job = parse_name(job, "job")
        scope = request.get(SCOPE)
        if job is not None and not job_allowed(scope, job):
            return json_response({"sessions": [], "next": None})
        states = tuple(x for x in (q.get("state") or "").split(",") if x)
        if any(x not in ("open", "localizing", "done", "failed") for x in states):
            raise RequestError("state: one or more of open, localizing, done, failed (comma-separated)")
        limit = parse_int_param(q.get("limit"), "limit", 1, MAX_PAGE, MAX_PAGE)
        desc = q.get("order", "asc") == "desc"
        if q.get("order", "asc") not in ("asc", "desc"):
            raise RequestError("order: asc or desc")
        after = parse_int_param(q.get("after"), "after", 0, 2**62, 0)
        before = parse_int_param(q.get("before"), "before", 1, 2**62, 2**62)
        body = await asyncio.to_thread(self._page, scope, job, states, limit, desc, after, before)
        return web.Response(body=body, content_type="application/json")

    def _page(self, scope: Any, job: str | None, states: tuple[str, ...], limit: int, desc: bool, after: int,
              before: int) -> bytes:
        """One page, serialized (on a worker thread)."""
        out: list[SessionRecord] = []
        more = True
        while more and len(out) < limit:  # a job token's sessions may be sparse: read on
            page = self.store.sessions(job=job, states=states, after_seq=after, before_seq=before, limit=limit,
                                       newest_first=desc)
            out.extend(s for s in page if job_allowed(scope, s.job))
            more = len(page) == limit
            if page:
                after, before = (after, page[-1].seq) if desc else (page[-1].seq, before)
        if len(out) > limit:
            out, more = out[:limit], True
        cursor = out[-1].seq if more and out else None
        return dumps_bytes({"sessions": [self._summary_dict(s) for s in out], "next": cursor})

    async def get_session(self, request: web.Request) -> web.Response:
        session = parse_name(request.match_info["session"], "session")
        scope = request.get(SCOPE)

        def read() -> bytes | None:
            s = self.store.get_session(session)
            if s is None or not job_allowed(scope, s.job):
                return None
            return dumps_bytes(self._session_dict(s))

        body = await asyncio.to_thread(read)
        if body is None:
            return error_response(404, f"unknown session {session!r}")
        return web.Response(body=body, content_type="application/json")

    async def get_report(self, request: web.Request) -> web.Response:
        session = parse_name(request.match_info["session"], "session")
        scope = request.get(SCOPE)
        s = await asyncio.to_thread(self.store.get_session, session, with_uploaded=False)
        if s is None or not job_allowed(scope, s.job):
            return error_response(404, f"unknown session {session!r}")
        body = await asyncio.to_thread(self._report_body, session)
        if body is not None:
            return web.Response(body=body, content_type="application/json")
        if s.state == "failed":
            return error_response(409, f"session {session!r} failed: {s.error}", state=s.state)
        if s.state == "done":  # closed with no report, e.g. a hang session whose job resumed
            return error_response(404, f"session {session!r} closed without a report: {s.error}", state=s.state)
        s = await asyncio.to_thread(self.store.get_session, session)
        if s is None:
            return error_response(404, f"unknown session {session!r}")
        body = await asyncio.to_thread(dumps_bytes, {"state": s.state, "uploaded": list(s.uploaded),
                                                     "expected": list(s.expected), "deadline_ns": s.deadline_ns})
        return web.Response(body=body, status=202, content_type="application/json")

    def _report_body(self, session: str) -> bytes | None:
        d = self.store.events.get_report_dict(session)
        return None if d is None else dumps_bytes(d)
