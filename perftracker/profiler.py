"""The low-level Kineto path: start and stop torch's profiler without ``torch.profiler.profile``.

``KinetoCapture.start()`` / ``stop()`` call ``torch.autograd._prepare_profiler``,
``_enable_profiler`` and ``_disable_profiler`` directly, so no ``EventList`` is built and nothing is
exported as Chrome JSON. ``kineto_rows`` turns the ``_ProfilerResult`` into event rows; the window
calls it off the main thread.

Time base: Kineto event times (``_KinetoEvent.start_ns``) are Unix time (CLOCK_REALTIME ns, from
torch's TSC-based approximate clock converted at profiler start). We measure the offset
CLOCK_REALTIME - CLOCK_MONOTONIC when the window starts and subtract it, which puts every event on
CLOCK_MONOTONIC, the base the samplers read. tests/test_timebase.py proves the alignment.

Thread ids: Kineto CPU events carry RecordFunction's sequential thread id, not the OS id. The
window records a marker op on the training thread at start; its thread id is the training
thread's, which we map to the OS id. Other threads keep a negative id (-RecordFunction id).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig

from perftracker.errors import ProfilerError
from perftracker.rawdata import EventKind
from perftracker.throttle import NoThrottle, Throttle

log = logging.getLogger(__name__)

MARKER = "perftracker::window_start"

_KINDS = {
    "cpu_op": EventKind.CPU_OP,
    "user_annotation": EventKind.ANNOTATION,
    "gpu_user_annotation": EventKind.ANNOTATION,
    "kernel": EventKind.KERNEL,
    "gpu_memcpy": EventKind.MEMCPY,
    "gpu_memset": EventKind.MEMSET,
    "cuda_runtime": EventKind.RUNTIME,
    "cuda_driver": EventKind.RUNTIME,
    "python_function": EventKind.PYTHON,
}


def realtime_offset_ns(tries: int = 7) -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few bracketed readings."""
    best_gap, best = None, 0
    for _ in range(tries):
        m0 = time.monotonic_ns()
        r = time.time_ns()
        m1 = time.monotonic_ns()
        if best_gap is None or m1 - m0 < best_gap:
            best_gap, best = m1 - m0, r - (m0 + m1) // 2
    return best


def profiler_active() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled) or bool(torch._C._autograd._profiler_enabled())


@dataclass
class KinetoCapture:
    """One start/stop of torch's profiler on the calling (training) thread."""

    with_stack: bool = False  # torch's Python tracer; off by default (see stacks.py)
    record_gc: bool = True  # record_python_gc_info; only takes effect with the Python tracer
    cuda: bool = field(default_factory=lambda: torch.cuda.is_available())
    offset_ns: int = 0
    started: bool = False

    def _config(self) -> tuple[Any, set[Any]]:
        exp = _ExperimentalConfig(record_python_gc_info=self.record_gc and self.with_stack)
        cfg = ProfilerConfig(ProfilerState.KINETO, False, False, self.with_stack, False, False, exp)
        acts = {ProfilerActivity.CPU}
        if self.cuda:
            acts.add(ProfilerActivity.CUDA)
        return cfg, acts

    def start(self) -> None:
        """Start profiling; raises ProfilerError (with torch's reason) and leaves nothing enabled."""
        if profiler_active():
            raise ProfilerError("another profiler is already active in this process")
        cfg, acts = self._config()
        try:
            torch.autograd._prepare_profiler(cfg, acts)
            torch.autograd._enable_profiler(cfg, acts)
        except Exception as exc:
            raise ProfilerError(f"torch profiler failed to start: {type(exc).__name__}: {exc}") from None
        self.started = True
        self.offset_ns = realtime_offset_ns()
        with torch.autograd.profiler.record_function(MARKER):
            pass

    def stop(self) -> Any:
        """Stop profiling and return the raw ``_ProfilerResult`` (not post-processed)."""
        if not self.started:
            raise ProfilerError("profiler was not started")
        self.started = False
        try:
            return torch.autograd._disable_profiler()
        except Exception as exc:
            raise ProfilerError(f"torch profiler failed to stop: {type(exc).__name__}: {exc}") from None


@dataclass
class KinetoRows:
    kind: list[int] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    tid: list[int] = field(default_factory=list)
    device: list[int] = field(default_factory=list)
    start_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)
    python_id: list[int] = field(default_factory=list)  # tracer mode: Kineto python ids
    python_parent_id: list[int] = field(default_factory=list)


def kineto_rows(
    result: Any, offset_ns: int, training_tid: int, lo_ns: int, hi_ns: int, throttle: Throttle | None = None
) -> KinetoRows:
    """Rows of a ``_ProfilerResult`` on CLOCK_MONOTONIC, clipped to events overlapping [lo, hi]."""
    tick = (throttle or NoThrottle()).tick
    events = result.events()
    main_rf = None
    for e in events:
        if e.activity_type() == "user_annotation" and e.name() == MARKER:
            main_rf = e.start_thread_id()
            break
    rows = KinetoRows()
    cpu = torch.autograd.DeviceType.CPU
    undecodable = 0
    for e in events:
        tick()
        try:
            name = e.name()
        except UnicodeDecodeError:  # seen for Python-tracer events read off the main thread
            undecodable += 1
            name = "<undecodable name>"
        if name == MARKER:
            continue
        start = e.start_ns() - offset_ns
        end = e.end_ns() - offset_ns
        if end < lo_ns or start > hi_ns:
            continue
        act = e.activity_type()
        kind = _KINDS.get(act, EventKind.OTHER)
        if kind == EventKind.PYTHON and not e.is_python_function():
            kind = EventKind.GC if name == "Python GC" else EventKind.OTHER
        on_cpu = e.device_type() == cpu
        if on_cpu:
            rf = e.start_thread_id()
            tid = training_tid if rf == main_rf else -int(rf)
            device = -1
        else:
            tid = int(e.device_resource_id())
            device = int(e.device_index())
        rows.kind.append(int(kind))
        rows.name.append(name)
        rows.tid.append(tid)
        rows.device.append(device)
        rows.start_ns.append(start)
        rows.end_ns.append(max(end, start))
        if kind == EventKind.PYTHON:
            rows.python_id.append(int(e.python_id()))
            rows.python_parent_id.append(int(e.python_parent_id()))
        else:
            rows.python_id.append(-1)
            rows.python_parent_id.append(-1)
    if undecodable:
        log.warning("%d profiler events had undecodable names (kept as '<undecodable name>')", undecodable)
    if main_rf is None:
        log.warning("window marker missing from the profile: training-thread events keep RecordFunction ids")
    return rows
