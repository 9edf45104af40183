"""Prometheus metrics of the localizer service, served at ``GET /metrics`` (bearer token, like every
path but /v1/healthz).

- ``perftracker_localizer_sessions{state,kind}``: sessions in the store by state and kind (a gauge
  read from the store at scrape time; every state is listed for each kind seen, 0 included);
- ``perftracker_localizer_reports_total{kind,status}``: reports stored by this process;
- ``perftracker_localizer_findings_total{category}``: findings of those reports, by category;
- ``perftracker_localizer_upload_duration_seconds{kind,result}``: time to handle an upload
  (patterns, hang_snapshot), from routing to the response: reading, validating, committing.

``install(service)`` adds the route, the timing middleware and the report callback; the service
module only calls it. One registry per service (tests run several in one process).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

from aiohttp import web
from perftracker.localizer.service.http_io import SCOPE
from perftracker.localizer.service.localize_runner import LocalizeRunner
from perftracker.localizer.service.session.manager import DONE, FAILED, LOCALIZING, OPEN
from perftracker.localizer.service.validate import RequestError
from perftracker.localizer.store.sqlite_store import Store
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from perftracker.model import Report

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
STATES = (OPEN, LOCALIZING, DONE, FAILED)
UPLOAD_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# route (aiohttp canonical) -> upload kind
UPLOAD_ROUTES = {("POST", "/v1/sessions/{session}/patterns"): "patterns", ("POST", "/v1/hang-snapshots"): "hang_snapshot"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _SessionsCollector(Collector):
    def __init__(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("perftracker_localizer_sessions", "Sessions in the store by state and kind.",
                                   labels=["state", "kind"])
        try:
            counts = self._counts()
        except Exception as exc:  # noqa: BLE001 - a failing store must not fail the scrape
            log.warning("/metrics: cannot count sessions: %s", exc)
            counts = {}
        for kind in sorted({k for _, k in counts}):
            for state in sorted(set(STATES) | {s for s, k in counts if k == kind}):
                family.add_metric([state, kind], counts.get((state, kind), 0))
        yield family


class _CulpritsCollector(Collector):
    """Hosts named as the culprit (issue 49; perftracker.localizer.store.culprit_store), from the store:
    sessions within the last 7 days that named each (host, cause)."""

    def __init__(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("perftracker_localizer_culprit_sessions",
                                   "Sessions of the last 7 days whose report named the host as the culprit, by cause.",
                                   labels=["host", "cause"])
        try:
            counts = self._counts()
        except Exception as exc:  # noqa: BLE001 - a failing store must not fail the scrape
            log.warning("/metrics: cannot count culprit hosts: %s", exc)
            counts = {}
        for (host, cause), n in sorted(counts.items()):
            family.add_metric([host, cause], n)
        yield family


class LocalizerMetrics:
    def __init__(self, session_counts: Callable[[], dict[tuple[str, str], int]],
                 culprit_counts: Callable[[], dict[tuple[str, str], int]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(_SessionsCollector(session_counts))
        if culprit_counts is not None:
            r.register(_CulpritsCollector(culprit_counts))
        self.reports = Counter("perftracker_localizer_reports", "Reports stored by this localizer process.",
                               ["kind", "status"], registry=r)
        self.findings = Counter("perftracker_localizer_findings", "Findings of the stored reports, by category.",
                                ["category"], registry=r)
        self.upload_s = Histogram("perftracker_localizer_upload_duration_seconds",
                                  "Time to handle an upload: read, validate, commit to the store.",
                                  ["kind", "result"], buckets=UPLOAD_BUCKETS_S, registry=r)

    def on_report(self, report: Report) -> None:
        self.reports.labels(report.kind, report.status).inc()
        for f in report.findings:
            self.findings.labels(f.category.value).inc()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route
        kind = UPLOAD_ROUTES.get((request.method, getattr(route.resource, "canonical", "")))
        if kind is None:
            return await handler(request)
        t0 = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self.upload_s.labels(kind, "ok" if status < 400 else "error").observe(time.perf_counter() - t0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    async def handle(self, request: web.Request) -> web.Response:
        if request.get(SCOPE) is not None:  # every job's counts: the main token's (issue 46)
            raise RequestError("/metrics covers every job: it needs the main token, not a job-scoped one",
                               status=403)
        body = await asyncio.to_thread(self.exposition)  # the sessions count reads sqlite
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp


class MeteredService(Protocol):
    """The service as ``install`` sees it (a LocalizerService, perftracker.localizer.service.http_service)."""

    @property
    def app(self) -> web.Application: ...

    @property
    def store(self) -> Store: ...

    @property
    def localize_runner(self) -> LocalizeRunner: ...


def install(service: MeteredService) -> LocalizerMetrics:
    """Serve ``GET /metrics`` on ``service.app`` (a LocalizerService whose app is not yet started)."""
    store = service.store
    metrics = LocalizerMetrics(store.session_counts, lambda: store.culprits.counts(time.time_ns()))
    service.app.middlewares.append(metrics.middleware)
    service.app.router.add_get(METRICS_PATH, metrics.handle)
    service.localize_runner.on_report.append(metrics.on_report)
    return metrics
