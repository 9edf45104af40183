"""Prometheus text-format metrics of the node agent (exposition format 0.0.4).

A tiny registry: gauges and counters keyed by label tuples, rendered by ``render()``. The agent's
HTTP endpoint serves ``render()`` at ``/metrics``. What it exports:

- ``perftracker_workers{job}``: connected training processes;
- ``perftracker_iteration_ms{job,rank}``: recent mean iteration time, and
  ``perftracker_iteration_min_ms{job,rank}`` the recent shortest;
- ``perftracker_iterations{job,rank}``: completed iterations;
- ``perftracker_detector_phase{job,rank,phase}``: 1 for the rank's current detector phase;
- ``perftracker_sessions_total{state}``: sessions seen by this agent (started, uploaded, failed);
- ``perftracker_triggers_total{job}``, ``perftracker_uploads_total{kind,result}``;
- ``perftracker_summarize_seconds_sum`` / ``_count``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

_HELP: dict[str, tuple[str, str]] = {
    "perftracker_workers": ("gauge", "Training processes connected to this agent."),
    "perftracker_iteration_ms": ("gauge", "Recent mean iteration time per rank, milliseconds."),
    "perftracker_iteration_min_ms": ("gauge", "Recent shortest iteration time per rank, milliseconds."),
    "perftracker_iterations": ("gauge", "Completed training iterations per rank."),
    "perftracker_detector_phase": ("gauge", "1 for the detector phase each rank is in."),
    "perftracker_sessions_total": ("counter", "Profiling sessions handled by this agent, by outcome."),
    "perftracker_triggers_total": ("counter", "Triggers received from workers and forwarded."),
    "perftracker_uploads_total": ("counter", "Uploads to the localizer, by kind and result."),
    "perftracker_summarize_seconds_sum": ("counter", "Total wall time spent summarizing windows."),
    "perftracker_summarize_seconds_count": ("counter", "Windows summarized."),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


class Metrics:
    """Thread-safe gauges and counters; label sets are plain dicts."""

    def __init__(self) -> None:
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = {name: {} for name in _HELP}
        self._lock = threading.Lock()

    @staticmethod
    def _key(labels: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((str(k), str(v)) for k, v in labels.items()))

    def set(self, name: str, value: float, **labels: object) -> None:
        with self._lock:
            self._values[name][self._key(labels)] = float(value)

    def inc(self, name: str, amount: float = 1.0, **labels: object) -> None:
        with self._lock:
            series = self._values[name]
            key = self._key(labels)
            series[key] = series.get(key, 0.0) + amount

    def get(self, name: str, **labels: object) -> float | None:
        with self._lock:
            return self._values[name].get(self._key(labels))

    def remove(self, name: str, **match: object) -> None:
        """Drop every series of ``name`` whose labels include ``match``."""
        want = set(self._key(match))
        with self._lock:
            for key in [k for k in self._values[name] if want <= set(k)]:
                del self._values[name][key]

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name, (kind, help_text) in _HELP.items():
                series = self._values[name]
                lines.append(f"# HELP {name} {help_text}")
                lines.append(f"# TYPE {name} {kind}")
                for key, value in sorted(series.items()):
                    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
                    lines.append(f"{name}{{{labels}}} {_fmt(value)}" if labels else f"{name} {_fmt(value)}")
        return "\n".join(lines) + "\n"


async def serve(metrics: Metrics, host: str, port: int) -> tuple[Any, str]:
    """Serve ``metrics.render()`` at ``http://host:port/metrics`` (aiohttp; port 0: any free one).
    Returns (the aiohttp runner to ``cleanup()``, the URL)."""
    from aiohttp import web

    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = getattr(site, "_server", None)
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, f"http://{host}:{bound}/metrics"
