"""One localizer per job, across nodes (issue 42): which localizer each job's calls go to.

A node agent serves the ranks of every job on its node. A job whose ranks all run here reports to
the agent's own localizer (the default uplink: the embedded localizer, or a shared service). A job
that spans nodes reports to *one* localizer, the one on the node of its global rank 0: that rank's
worker asks its agent to serve the job (``JOB_SERVE``) and publishes the URL and a job token in the
job's rendezvous store; the workers on the other nodes read it there and tell their agent
(``JOB_ROUTE``). ``RoutedUplink`` then sends that job's registrations, heartbeats, triggers, long
polls and uploads there, and everything else to the default.

``JobServer`` is the seam to the agent's embedded localizer (``EmbeddedLocalizer.serve_job``), so
that this package does not import the localizer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from perftracker.agent.daemon.localizer_client import TriggerNotice
from perftracker.agent.daemon.localizer_link import LocalizerUplink

from perftracker.model import HangSnapshot, PatternSet

log = logging.getLogger(__name__)


class JobServer(Protocol):
    """The agent's own localizer, able to serve one job to other nodes on an address of this node."""

    def serve_job(self, job: str, host: str, port: int, token: str) -> str: ...


class RoutedUplink:
    """A ``LocalizerUplink`` that sends each job's calls to that job's localizer.

    ``make(url, token)`` builds the uplink of a routed job; ``on_route(job, url, token)`` is told of
    each new route (the agent records it for ``perftracker report``)."""

    def __init__(self, default: LocalizerUplink, make: Callable[[str, str], LocalizerUplink],
                 on_route: Callable[[str, str, str], None] | None = None) -> None:
        self.default = default
        self._make = make
        self._on_route = on_route
        self._routes: dict[str, tuple[str, str, LocalizerUplink]] = {}
        self._lock = threading.Lock()  # calls run on the agent's uplink threads

    @property
    def url(self) -> str:
        return self.default.url

    def route(self, job: str, url: str, token: str) -> bool:
        """Send ``job`` to ``url`` from now on; False when it already goes there."""
        with self._lock:
            old = self._routes.get(job)
            if old is not None and old[:2] == (url, token):
                return False
            uplink = self._make(url, token)
            adopt = getattr(uplink, "adopt_keys", None)
            if old is not None and adopt is not None:
                adopt(old[2])  # the same job localizer, restarted: its store still knows this agent
            self._routes[job] = (url, token, uplink)
        log.warning("job %s reports to its localizer at %s (served by the node of its rank 0)", job, url)
        if self._on_route is not None:
            self._on_route(job, url, token)
        return True

    def unroute(self, job: str) -> bool:
        """Send ``job`` to the default from now on (this agent's own localizer serves it); whether it was routed."""
        with self._lock:
            return self._routes.pop(job, None) is not None

    def route_of(self, job: str) -> str | None:
        """The URL ``job`` is routed to, or None (the default)."""
        with self._lock:
            r = self._routes.get(job)
        return r[0] if r else None

    def for_job(self, job: str) -> LocalizerUplink:
        with self._lock:
            r = self._routes.get(job)
        return r[2] if r else self.default

    # ------------------------------------------------------------ LocalizerUplink, by job
    def register(self, job: str, agent_id: str, host: str, workers: Sequence[Mapping[str, Any]]) -> object:
        return self.for_job(job).register(job, agent_id, host, workers)

    def heartbeat(self, job: str, agent_id: str, ranks: Sequence[Mapping[str, Any]]) -> None:
        self.for_job(job).heartbeat(job, agent_id, ranks)

    def create_trigger(self, job: str, reason: str = "on-demand", window_s: float | None = None,
                       detection: Mapping[str, Any] | None = None) -> tuple[str, bool]:
        return self.for_job(job).create_trigger(job, reason, window_s, detection)

    def upload_hang_snapshot(self, snap: HangSnapshot) -> object:
        return self.for_job(snap.job).upload_hang_snapshot(snap)

    def poll_trigger(self, job: str, after: str | None = None, timeout_s: float = 30.0) -> TriggerNotice | None:
        return self.for_job(job).poll_trigger(job, after, timeout_s)

    def upload_patterns(self, ps: PatternSet, compressed: bool = True) -> object:
        return self.for_job(ps.job).upload_patterns(ps, compressed)

    def upload_pattern_batch(self, sets: Sequence[PatternSet]) -> object:
        by_job: dict[str, list[PatternSet]] = {}
        for ps in sets:
            by_job.setdefault(ps.job, []).append(ps)
        out: object = None
        for job, group in by_job.items():
            out = self.for_job(job).upload_pattern_batch(group)
        return out

    def list_sessions(self, job: str | None = None) -> list[dict[str, Any]]:
        """The default localizer's sessions (the agent's idle check asks its own localizer)."""
        fn = getattr(self.default, "list_sessions", None)
        return list(fn(job)) if fn is not None else []
