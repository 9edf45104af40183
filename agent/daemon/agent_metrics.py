"""Prometheus metrics of the node agent (prometheus_client, one registry per agent).

What it exports (names follow the Prometheus conventions: base units, ``_total`` counters; the
training job's id is the label ``training_job``, since ``job`` is the scrape target's own label):

- ``perftracker_workers{training_job}``: connected training processes (gauge);
- ``perftracker_iteration_duration_seconds{training_job,rank}``: training iteration times
  (histogram; each iteration observed once, from the workers' ITER_STATS messages);
- ``perftracker_iterations_total{training_job,rank}``: completed iterations;
- ``perftracker_detector_phase{training_job,rank,phase}``: 1 for the detector phase each rank is in;
- ``perftracker_sessions_total{state}``: sessions handled by this agent (started, uploaded, failed);
- ``perftracker_triggers_total{training_job}``: triggers received from workers and forwarded;
- ``perftracker_uploads_total{kind,result}``: uploads to the localizer;
- ``perftracker_summarize_duration_seconds``: wall time to summarize one window (histogram).

``serve()`` answers ``/metrics`` (the text exposition format) and ``/healthz`` (200 while the agent's
event loop ticked within ``stale_after_s``, else 503: the sidecar's liveness probe) on a small
threaded HTTP server. prometheus_client is a base dependency; should an install lack it, the agent
runs with these methods as no-ops and refuses ``--metrics-port`` (``ConfigError``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from perftracker.errors import ConfigError

ITERATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
SUMMARIZE_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def available() -> bool:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


class Metrics:
    """The agent's collectors and the bookkeeping that turns worker messages into them."""

    def __init__(self) -> None:
        self.enabled = available()
        self._lock = threading.Lock()
        self._iterations: dict[tuple[str, int], int] = {}  # last iteration counted
        self._observed: dict[tuple[str, int], int] = {}  # last iteration whose duration was observed
        self._phase: dict[tuple[str, int], str] = {}
        self._tick = time.monotonic()
        if not self.enabled:
            return
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self._workers = Gauge("perftracker_workers", "Training processes connected to this agent.", ["training_job"], registry=r)
        self._iteration_s = Histogram("perftracker_iteration_duration_seconds", "Training iteration time per rank.",
                                      ["training_job", "rank"], buckets=ITERATION_BUCKETS_S, registry=r)
        self._iterations_total = Counter("perftracker_iterations", "Completed training iterations per rank.",
                                         ["training_job", "rank"], registry=r)
        self._detector_phase = Gauge("perftracker_detector_phase", "1 for the detector phase each rank is in.",
                                     ["training_job", "rank", "phase"], registry=r)
        self._sessions = Counter("perftracker_sessions", "Profiling sessions handled by this agent, by outcome.",
                                 ["state"], registry=r)
        self._triggers = Counter("perftracker_triggers", "Triggers received from workers and forwarded.", ["training_job"],
                                 registry=r)
        self._uploads = Counter("perftracker_uploads", "Uploads to the localizer, by kind and result.",
                                ["kind", "result"], registry=r)
        self._summarize_s = Histogram("perftracker_summarize_duration_seconds", "Wall time to summarize one window.",
                                      buckets=SUMMARIZE_BUCKETS_S, registry=r)

    # ---------------------------------------------------------------- updates (any thread)
    def workers(self, job: str, n: int) -> None:
        if self.enabled:
            self._workers.labels(job).set(n)

    def heartbeat(self, job: str, rank: int, iteration: int, phase: str) -> None:
        """A worker's iteration count and detector phase."""
        if not self.enabled:
            return
        key = (job, rank)
        with self._lock:
            last = self._iterations.get(key)
            self._iterations[key] = iteration
            old_phase = self._phase.get(key)
            self._phase[key] = phase
        # a restarted worker counts from 0 again: its iterations are new ones
        new = iteration if last is None or iteration < last else iteration - last
        if new > 0:
            self._iterations_total.labels(job, str(rank)).inc(new)
        if old_phase != phase:
            if old_phase:
                self._detector_phase.remove(job, str(rank), old_phase)
            if phase:
                self._detector_phase.labels(job, str(rank), phase).set(1)

    def iteration_times(self, job: str, rank: int, iteration: int, recent_ms: Iterable[float]) -> int:
        """Observe the iterations of ``recent_ms`` (the durations up to ``iteration``) not observed
        before; returns how many were new."""
        if not self.enabled:
            return 0
        recent = [float(x) for x in recent_ms]
        key = (job, rank)
        with self._lock:
            last = self._observed.get(key)
            self._observed[key] = iteration
        new = len(recent) if last is None or iteration < last else min(len(recent), iteration - last)
        if new <= 0:
            return 0
        hist = self._iteration_s.labels(job, str(rank))
        for ms in recent[-new:]:
            if ms >= 0 and ms == ms and ms != float("inf"):
                hist.observe(ms / 1e3)
        return new

    def trigger(self, job: str) -> None:
        if self.enabled:
            self._triggers.labels(job).inc()

    def session(self, state: str) -> None:
        if self.enabled:
            self._sessions.labels(state).inc()

    def upload(self, kind: str, ok: bool) -> None:
        if self.enabled:
            self._uploads.labels(kind, "ok" if ok else "error").inc()

    def summarized(self, seconds: float) -> None:
        if self.enabled:
            self._summarize_s.observe(max(0.0, seconds))

    def tick(self) -> None:
        """The agent's event loop is alive (``/healthz``)."""
        self._tick = time.monotonic()

    # ---------------------------------------------------------------- exposition
    def render(self) -> bytes:
        """The text exposition format (what ``/metrics`` serves)."""
        if not self.enabled:
            return b""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def healthy(self, stale_after_s: float) -> bool:
        return time.monotonic() - self._tick <= stale_after_s


MAX_CONNECTIONS = 32  # open connections (threads) at once; past it a new one is closed at once (issue 46)
MAX_PER_CLIENT = 8  # of them from one address: one client cannot take the slots the liveness probe needs
READ_TIMEOUT_S = 5.0  # a connection that sends no complete request in this long is closed


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most ``MAX_CONNECTIONS``, ``MAX_PER_CLIENT`` of them from one
    address (issue 46: 1,009 idle connections gave the agent 1,024 fds and 1,011 threads, and
    /healthz timed out, so the liveness probe would restart it forever); the rest are closed at
    once, counted in ``refused``. A failing connection is not logged (it was 69,000 lines)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._per_client: dict[str, int] = {}
        self._lock = threading.Lock()
        self.refused = 0

    def _take(self, client: str) -> bool:
        with self._lock:
            if self._per_client.get(client, 0) >= MAX_PER_CLIENT or not self._slots.acquire(blocking=False):
                self.refused += 1
                return False
            self._per_client[client] = self._per_client.get(client, 0) + 1
            return True

    def _give(self, client: str) -> None:
        with self._lock:
            n = self._per_client.pop(client, 1) - 1
            if n > 0:
                self._per_client[client] = n
            self._slots.release()

    def process_request(self, request: Any, client_address: Any) -> None:
        client = str(client_address[0]) if isinstance(client_address, tuple) and client_address else ""
        if not self._take(client):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give(client)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give(str(client_address[0]) if isinstance(client_address, tuple) and client_address else "")

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away or timed out: nothing to log


class _QuietHandler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_S  # applied to the connection's socket: an idle client is dropped

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class MetricsServer:
    """``/metrics`` and ``/healthz`` of one Metrics, served on a daemon thread."""

    def __init__(self, metrics: Metrics, host: str, port: int, stale_after_s: float = 30.0) -> None:
        if not metrics.enabled:
            raise ConfigError("--metrics-port needs prometheus_client, a dependency of perftracker missing here: "
                              "pip install 'prometheus_client>=0.20'")
        from prometheus_client import CONTENT_TYPE_LATEST

        def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/healthz":
                ok = metrics.healthy(stale_after_s)
                start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"ok\n" if ok else b"the agent's event loop is stalled\n"]
            if path in ("/metrics", "/"):
                start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST),
                                          ("X-Content-Type-Options", "nosniff")])
                return [metrics.render()]
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: /metrics, /healthz\n"]

        self._httpd = make_server(host, port, app, _Server, handler_class=_QuietHandler)
        self.port = int(self._httpd.server_port)
        self.url = f"http://{host}:{self.port}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
