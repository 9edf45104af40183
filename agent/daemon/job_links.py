"""The node agent's side of one localizer per job across nodes (issue 42; the worker's side:
perftracker/runtime/job_link.py, the routing: job_routes.py).

- ``JOB_SERVE`` from global rank 0: this agent's own localizer serves the job on the job's
  interface with the job's token (``JobServer.serve_job``); the answer is ``JOB_SERVED``.
- ``JOB_ROUTE`` from a rank on this node: the job's localizer runs on another node; the job's calls
  go there from now on (``RoutedUplink.route``), unless this agent serves the job itself.
- A worker whose job spans nodes registers with ``job_link: pending``: the job is *held*, registered
  nowhere, until its localizer is known, or ``JOB_LINK_WAIT_S`` passed (then the agent's own).
- ``report_stored``: a report of a job served here is stored; global rank 0 says where in its log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from perftracker.agent.daemon.job_routes import JobServer, RoutedUplink
from perftracker.agent.daemon.localizer_link import LocalizerUplink, Upstream
from perftracker.agent.daemon.window_session import send
from perftracker.agent.daemon.workers import Worker

from perftracker.errors import PerftrackerError
from perftracker.warnonce import WarnOnce
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType

log = logging.getLogger(__name__)

JOB_LINK_WAIT_S = 30.0  # a multi-node job's ranks name its localizer within this, else the agent's own
FEATURE = "job_link"  # listed in the ACK: this agent serves and routes jobs (perftracker/runtime/job_link.py)


class JobLinks:
    """Which localizer each job of this agent reports to (see the module doc). ``pollers`` is the
    daemon's job -> long-poll task map (restarted when a job's localizer changes)."""

    def __init__(self, agent_id: str, uplink: LocalizerUplink, job_server: JobServer | None, upstream: Upstream,
                 pollers: dict[str, asyncio.Task[None]], workers: Mapping[tuple[str, int], Worker],
                 spawn: Callable[[Any, str], asyncio.Task[Any]]) -> None:
        self.agent_id = agent_id
        self.uplink = uplink
        self.job_server = job_server
        self.routes = uplink if isinstance(uplink, RoutedUplink) else None
        self.upstream = upstream
        self.pollers = pollers
        self.workers = workers
        self.spawn = spawn
        self.loop: asyncio.AbstractEventLoop | None = None  # the daemon's, once it runs
        self.linked: set[str] = set()  # jobs whose localizer is known
        self.serving: set[str] = set()  # ... and those this agent's own localizer serves to other nodes
        self._warn_once = WarnOnce(log)

    @property
    def active(self) -> bool:
        """Whether jobs find their localizer this way: this agent has its own localizer to serve them
        with and can route them (an agent of a shared localizer, ``--url``, has nothing to do)."""
        return self.job_server is not None and self.routes is not None

    def features(self) -> list[str]:
        return [FEATURE] if self.active else []

    def on_register(self, job: str, msg: Mapping[str, Any]) -> None:
        if msg.get("job_link") == "pending" and self.active and job not in self.linked:
            self.hold(job)

    def hold(self, job: str) -> None:
        """Register ``job`` nowhere until its localizer is known, at most ``JOB_LINK_WAIT_S``."""
        if job in self.upstream.held:
            return
        self.upstream.held.add(job)

        async def give_up() -> None:
            await asyncio.sleep(JOB_LINK_WAIT_S)
            if job in self.upstream.held:
                self._warn_once(f"link-{job}", "job %s spans nodes but no rank named its localizer within %.0f s; "
                                "this node's ranks report to this agent's own localizer", job, JOB_LINK_WAIT_S)
                self.release(job)

        self.spawn(give_up(), f"link-wait-{job}")

    def release(self, job: str) -> None:
        """``job``'s localizer is known (its route is set, or it is this agent's own): register there."""
        self.linked.add(job)
        self.upstream.held.discard(job)
        self.upstream.schedule_register(job)
        poller = self.pollers.pop(job, None)
        if poller is not None:
            poller.cancel()  # a long poll on the old localizer: poll the job's from now on
        self.pollers[job] = self.spawn(self.upstream.poll_loop(job), f"poll-{job}")

    async def serve(self, w: Worker, msg: Mapping[str, Any]) -> None:
        """Global rank 0 asks this agent's localizer to serve its job to the job's other nodes."""
        url, error = "", ""
        if msg["job"] != w.job:
            error = f"rank {w.rank} is registered for job {w.job!r}, not {msg['job']!r}"
        elif self.job_server is None:
            error = (f"this node agent reports to the localizer at {self.uplink.url}; give every node the same "
                     "PERFTRACKER_LOCALIZER_URL")
        else:
            try:
                url = await asyncio.to_thread(self.job_server.serve_job, w.job, msg["host"], msg["port"], msg["token"])
            except PerftrackerError as exc:
                error = str(exc)
        if error:
            self._warn_once(f"serve-{w.job}", "cannot serve job %s to its other nodes: %s", w.job, error)
        else:
            log.warning("job %s: this node's localizer serves the job's other nodes at %s", w.job, url)
            self.serving.add(w.job)  # a route a rank read before rank 0 re-published is stale
            if self.routes is not None and self.routes.unroute(w.job):
                self.upstream.schedule_register(w.job)
        if msg["job"] == w.job:
            self.release(w.job)  # served here, or not at all: this agent's own localizer
        await send(w, wire.make_message(MessageType.JOB_SERVED, job=w.job, url=url, agent_id=self.agent_id,
                                        error=error[:500]))

    def route(self, w: Worker, msg: Mapping[str, Any]) -> None:
        """A rank of a multi-node job names the job's localizer (another node's): report there."""
        if msg["job"] != w.job or self.routes is None or self.job_server is None:
            return  # another job's name, or an agent of a shared localizer (not ``active``)
        if msg["served_by"] == self.agent_id or w.job in self.serving:  # this agent's own localizer serves it
            if w.job in self.upstream.held:
                self.release(w.job)
            return
        if self.routes.route(w.job, msg["url"], msg["token"]) or w.job in self.upstream.held:
            self.release(w.job)

    def report_stored(self, job: str, session: str, text: str) -> None:
        """A report of ``job`` is stored (called from any thread): global rank 0, when it runs on this
        node, says where in the training log (REPORT_READY)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return

        def tell() -> None:
            w = self.workers.get((job, 0))
            if w is not None and w.connected:
                msg = wire.make_message(MessageType.REPORT_READY, job=job, session=session, text=text[:600])
                self.spawn(send(w, msg), "report-ready")

        loop.call_soon_threadsafe(tell)
