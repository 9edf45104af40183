"""The Sampler seam: what every hardware sampler provides, and the window bounds they share.

A sampler runs in the sampler process (``python -m perftracker.agent.samplers``), in its own thread, from
``bounds.start_ns`` until ``bounds.end_ns`` (both CLOCK_MONOTONIC ns, the window's time base). The
bounds can move while it runs: the worker learns the real end of its window only at the first
iteration boundary after ``window_s``, and tells the sampler process over stdin.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from perftracker.model.raw_window import UtilSeries

# Samples are kept this far beyond the window on both sides, so that an execution that touches
# the window's edge still has samples around it.
EDGE_MARGIN_NS = 20_000_000


class WindowBounds:
    """Thread-safe, movable window bounds on CLOCK_MONOTONIC ns."""

    def __init__(self, start_ns: int, end_ns: int) -> None:
        self._lock = threading.Lock()
        self._start_ns = start_ns
        self._end_ns = end_ns
        self._stopped = threading.Event()

    @property
    def start_ns(self) -> int:
        with self._lock:
            return self._start_ns

    @property
    def end_ns(self) -> int:
        with self._lock:
            return self._end_ns

    def set_start(self, start_ns: int) -> None:
        with self._lock:
            self._start_ns = start_ns

    def set_end(self, end_ns: int) -> None:
        with self._lock:
            self._end_ns = end_ns

    def stop(self) -> None:
        """Stop now (the worker went away, or the caller gave up)."""
        self._stopped.set()

    def done(self, now_ns: int) -> bool:
        return self._stopped.is_set() or now_ns >= self.end_ns + EDGE_MARGIN_NS

    def wait_for_start(self) -> bool:
        """Sleep until EDGE_MARGIN_NS before the start. False if stopped meanwhile."""
        while not self._stopped.is_set():
            delta_ns = self.start_ns - EDGE_MARGIN_NS - time.monotonic_ns()
            if delta_ns <= 0:
                return True
            self._stopped.wait(min(delta_ns / 1e9, 0.05))
        return False

    def trim(self, series: UtilSeries) -> UtilSeries:
        """Drop samples further than EDGE_MARGIN_NS outside the final bounds."""
        lo, hi = self.start_ns - EDGE_MARGIN_NS, self.end_ns + EDGE_MARGIN_NS
        keep = (series.t_ns >= lo) & (series.t_ns <= hi)
        return UtilSeries(series.resource, series.t_ns[keep], series.value[keep], series.period_ns, series.source)


class Sampler(Protocol):
    """One source of utilization samples (procfs, NVML, nsys)."""

    name: str

    def unavailable_reason(self) -> str | None:
        """None if the sampler can run here; otherwise why not (logged, and the next one is tried)."""
        ...

    def run(self, bounds: WindowBounds) -> Mapping[str, UtilSeries]:
        """Sample over ``bounds`` (blocking until they end); return series keyed by resource."""
        ...


def rate_series(
    resource: str,
    t_ns: np.ndarray,
    counter: np.ndarray,
    peak_per_s: float,
    period_ns: int,
    source: str,
) -> UtilSeries:
    """Utilization from a monotonically increasing counter: Δcounter / Δt / peak, clipped to [0, 1].

    value[i] is the utilization over (t[i-1], t[i]]; the first sample has no interval and is dropped.
    """
    t = np.asarray(t_ns, dtype=np.int64)
    c = np.asarray(counter, dtype=np.float64)
    if len(t) < 2 or peak_per_s <= 0:
        return UtilSeries(resource, np.zeros(0, np.int64), np.zeros(0, np.float32), period_ns, source)
    dt_s = np.diff(t) / 1e9
    dc = np.maximum(np.diff(c), 0.0)  # a counter reset (wrap, interface re-created) reads as 0
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(dt_s > 0, dc / dt_s / peak_per_s, 0.0)
    return UtilSeries(resource, t[1:], np.clip(util, 0.0, 1.0).astype(np.float32), period_ns, source)
