"""The low-level Kineto path: start and stop torch's profiler without ``torch.profiler.profile``.

``KinetoCapture.start()`` / ``stop()`` call ``torch.autograd._prepare_profiler``,
``_enable_profiler`` and ``_disable_profiler`` directly, so no ``EventList`` is built and nothing is
exported as Chrome JSON. ``kineto_rows`` turns the ``_ProfilerResult`` into event rows; the window
calls it off the main thread.

Time base: Kineto event times (``_KinetoEvent.start_ns``) are Unix time (CLOCK_REALTIME ns, from
torch's TSC-based approximate clock converted at profiler start). We measure the offset
CLOCK_REALTIME - CLOCK_MONOTONIC when the window starts and subtract it, which puts every event on
CLOCK_MONOTONIC, the base the samplers read. tests/accuracy/test_timebase.py proves the alignment.

Thread ids: Kineto CPU events carry RecordFunction's sequential thread id, not the OS id. The
window records a marker op on the training thread at start; its thread id is the training
thread's, which we map to the OS id. Other threads keep a negative id (-RecordFunction id).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch._C._profiler import (
    ProfilerActivity,
    ProfilerConfig,
    ProfilerState,
    RecordScope,
    _ExperimentalConfig,
)

from perftracker.errors import ProfilerError
from perftracker.model.raw_window import EventKind
from perftracker.runtime.throttle import NoThrottle, Throttle

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


def experimental_config(**wanted: bool) -> tuple[Any, bool]:
    """``_ExperimentalConfig`` with those of ``wanted`` (all False-by-default flags) that the installed
    torch accepts, and whether every True one was taken. torch 2.3.1 has neither
    ``record_python_gc_info`` nor ``capture_overload_names`` (its keywords: profiler_metrics,
    profiler_measure_per_kernel, verbose, performance_events, enable_cuda_sync_events); 2.13 has
    both. Passing an unknown keyword raises TypeError, which would abort every window."""
    accepted = _accepted_keywords()
    kwargs: dict[str, Any] = {k: v for k, v in wanted.items() if v and (accepted is None or k in accepted)}
    try:
        exp = _ExperimentalConfig(**kwargs)
    except TypeError:  # a keyword the signature text did not show: the plain config
        if not kwargs:
            raise
        exp, kwargs = _ExperimentalConfig(), {}
    dropped = sorted(k for k, v in wanted.items() if v and k not in kwargs)
    if dropped and not _DROPPED_LOGGED:
        _DROPPED_LOGGED.append(True)
        log.info("torch %s's profiler has no %s; the windows run without it", torch.__version__, ", ".join(dropped))
    return exp, not dropped


_DROPPED_LOGGED: list[bool] = []


def _accepted_keywords() -> set[str] | None:
    """The keyword names of ``_ExperimentalConfig.__init__`` from pybind's signature text; None when
    it cannot be read (then the constructor is tried as is)."""
    doc = getattr(_ExperimentalConfig.__init__, "__doc__", None) or ""
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    if not first.startswith("__init__("):
        return None
    return set(re.findall(r"(\w+)\s*:", first)) - {"self"}


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

    gc_in_profile: bool = False  # whether torch records the GC in the profile (set by ``_config``)

    def _config(self) -> tuple[Any, set[Any]]:
        want_gc = self.record_gc and self.with_stack
        exp, taken = experimental_config(record_python_gc_info=want_gc)
        self.gc_in_profile = want_gc and taken
        cfg = ProfilerConfig(ProfilerState.KINETO, False, False, self.with_stack, False, False, exp)
        acts = {ProfilerActivity.CPU}
        if self.cuda:
            acts.add(ProfilerActivity.CUDA)
        return cfg, acts

    def start(self) -> None:
        """Start profiling; raises ProfilerError (with torch's reason) and leaves nothing enabled."""
        if profiler_active():
            raise ProfilerError("another profiler is already active in this process")
        try:
            cfg, acts = self._config()
            if self.cuda:
                for k, v in cupti_env(torch.version.cuda, cuda_graphs_in_use()).items():
                    os.environ.setdefault(k, v)  # read by Kineto; a value the user set stays
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
        global _last_stop_s
        if not self.started:
            raise ProfilerError("profiler was not started")
        self.started = False
        try:
            return torch.autograd._disable_profiler()
        except Exception as exc:
            raise ProfilerError(f"torch profiler failed to stop: {type(exc).__name__}: {exc}") from None
        finally:
            _last_stop_s = time.monotonic()


# **Exit right after a window.** Measured with torch 2.13 (CPU, gloo DDP under torchrun, no
# perftracker thread involved: start/stop on the main thread only): a process that exits within
# ~0.5 s of ``_disable_profiler()`` aborts in about 1 run in 3 ("terminate called without an active
# exception", SIGABRT, and torchrun then fails the whole job). Waiting 0.5 s still aborted 1 of 12,
# 1 s and 3 s 0 of 12 and 0 of 10 (2 s: 0 of 14). So the exit hook (perftracker/runtime/window/exit.py)
# lets the interpreter finalize only SETTLE_S after the last stop, and only when a window has just
# ended. 1 s, not 2 (issue 30: a window cut by the exit may cost the exit at most 2 s, its stop
# included): twice the ~0.5 s in which the aborts came, 0 of 12 at the time; rechecked 2026-11-28 with
# no settle at all, 0 aborts in 26 exits (docs/window-cost.md, "The end of training").
SETTLE_S = 1.0
_last_stop_s: float | None = None


def settle_after_stop(settle_s: float = SETTLE_S) -> float:
    """Sleep until ``settle_s`` after the last profiler stop of this process; the seconds slept."""
    if _last_stop_s is None:
        return 0.0
    wait_s = settle_s - (time.monotonic() - _last_stop_s)
    if wait_s <= 0:
        return 0.0
    time.sleep(wait_s)
    return wait_s


@dataclass
class KinetoRows:
    """Columns of the kept events (numpy arrays, in event order; ``name`` a list of str)."""

    kind: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    name_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # index into name_table
    name_table: list[str] = field(default_factory=list)
    tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    device: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    start_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    end_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    python_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # tracer mode; else -1
    python_parent_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # over every event of the profile, before the window's clip (``gpu_events_lost``)
    launches: int = 0  # CUDA runtime/driver calls that put work on the GPU
    gpu_events: int = 0  # kernels, memcpys, memsets

    def __len__(self) -> int:
        return len(self.name_idx)

    @property
    def name(self) -> list[str]:
        return [self.name_table[i] for i in self.name_idx.tolist()]


CHUNK = 2048  # events read per throttle tick (a few ms of GIL at most)
UNDECODABLE = "<undecodable name>"


def _names(chunk: list[Any]) -> tuple[list[str], int]:
    try:
        return [e.name() for e in chunk], 0
    except UnicodeDecodeError:  # seen for Python-tracer events read off the main thread
        out, bad = [], 0
        for e in chunk:
            try:
                out.append(e.name())
            except UnicodeDecodeError:
                out.append(UNDECODABLE)
                bad += 1
        return out, bad


USER_SCOPE = int(RecordScope.USER_SCOPE.value)  # record_function's scope (a user annotation)
_PYTHON_NAME = re.compile(r"^(<built-in |nn\.Module: |.+\(\d+\): )")  # Kineto's python_function names


def _activity_without_type(e: Any, cpu: Any, name: str) -> str:
    """An event's Kineto activity name where ``_KinetoEvent`` has no ``activity_type()``: from its
    device type, its flags and its name. torch 2.11 (seen on the H200 device check) has neither
    ``activity_type()`` nor ``is_python_function()``; 2.13 has both; 2.3.1 has neither, nor
    ``is_user_annotation()``: there a ``record_function`` range is the event whose ``scope()`` is
    RecordScope.USER_SCOPE (7, read on torch 2.3.1)."""
    flag = getattr(e, "is_user_annotation", None)
    if flag is not None:
        annotation = bool(flag())
    else:
        scope = getattr(e, "scope", None)
        annotation = scope is not None and int(scope()) == USER_SCOPE
    if e.device_type() == cpu:
        if annotation:
            return "user_annotation"
        is_fn = getattr(e, "is_python_function", None)
        if is_fn() if is_fn is not None else (name == UNDECODABLE or _PYTHON_NAME.match(name) is not None):
            return "python_function"
        if name.startswith(("cuda", "cu")) and len(name) > 4 and (name[2:3].isupper() or name[4:5].isupper()):
            return "cuda_runtime"  # cudaLaunchKernel, cudaMemcpyAsync, cuLaunchKernel, ...
        return "cpu_op"
    if annotation:
        return "gpu_user_annotation"
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    if name.startswith("Memset"):
        return "gpu_memset"
    return "kernel"


def activities(chunk: list[Any], cpu: Any, names: list[str]) -> list[str]:
    """The Kineto activity names of a chunk of ``_KinetoEvent``s whose names were read as ``names``
    (one pybind call each where torch has ``activity_type()``)."""
    if not chunk or hasattr(chunk[0], "activity_type"):
        return [e.activity_type() for e in chunk]
    return [_activity_without_type(e, cpu, n) for e, n in zip(chunk, names, strict=True)]


def kineto_rows(
    result: Any, offset_ns: int, training_tid: int, lo_ns: int, hi_ns: int, throttle: Throttle | None = None
) -> KinetoRows:
    """Rows of a ``_ProfilerResult`` on CLOCK_MONOTONIC, clipped to events overlapping [lo, hi].

    Each field is read for all events of a chunk with one comprehension (five pybind calls per
    event, no per-event Python logic); names are interned once; filtering, kinds and thread ids
    are numpy. The device type is read once per activity type: torch derives it from the activity
    (``deviceTypeFromActivity``)."""
    tick = (throttle or NoThrottle()).tick
    events = result.events()
    n = len(events)
    names: list[str] = []
    acts: list[str] = []
    start = np.empty(n, np.int64)
    end = np.empty(n, np.int64)
    rf = np.empty(n, np.int64)
    cpu = torch.autograd.DeviceType.CPU
    undecodable = 0
    for lo in range(0, n, CHUNK):
        chunk = events[lo:lo + CHUNK]
        hi = lo + len(chunk)
        got, bad = _names(chunk)
        names += got
        undecodable += bad
        acts += activities(chunk, cpu, got)
        if hasattr(chunk[0], "start_ns"):
            start[lo:hi] = [e.start_ns() for e in chunk]
            end[lo:hi] = [e.end_ns() for e in chunk]
        else:  # torch 2.3.1: µs only (start_us, duration_us), on the same Unix-time base
            start[lo:hi] = [e.start_us() for e in chunk]
            end[lo:hi] = [e.duration_us() for e in chunk]
            start[lo:hi] *= 1000
            end[lo:hi] = start[lo:hi] + end[lo:hi] * 1000
        rf[lo:hi] = [e.start_thread_id() for e in chunk]
        tick(len(chunk))
    act_ids: dict[str, int] = {}
    act_col = np.array([act_ids.setdefault(a, len(act_ids)) for a in acts], np.int64)
    kind_of_act = np.array([int(_KINDS.get(a, EventKind.OTHER)) for a in act_ids], np.int64)
    first_of_act = np.unique(act_col, return_index=True)[1] if n else np.zeros(0, np.int64)
    cpu_act = np.array([events[int(i)].device_type() == cpu for i in first_of_act], bool)
    name_ids: dict[str, int] = {}
    name_col = np.array([name_ids.setdefault(x, len(name_ids)) for x in names], np.int64)
    marker = name_ids.get(MARKER, -1)
    is_marker = name_col == marker
    main_rf = None
    ua = act_ids.get("user_annotation", -1)
    hits = np.flatnonzero(is_marker & (act_col == ua))
    if len(hits):
        main_rf = int(rf[hits[0]])
    start -= offset_ns
    end -= offset_ns
    keep = np.flatnonzero(~is_marker & (end >= lo_ns) & (start <= hi_ns))
    tick(len(keep))
    kind = kind_of_act[act_col[keep]] if n else np.zeros(0, np.int64)
    k_start, k_end = start[keep], end[keep]
    k_cpu = cpu_act[act_col[keep]] if n else np.zeros(0, bool)
    tid = np.where(rf[keep] == main_rf, training_tid, -rf[keep]) if main_rf is not None else -rf[keep]
    device = np.full(len(keep), -1, np.int64)
    for j in np.flatnonzero(~k_cpu).tolist():  # GPU events: few per window on a CPU host
        e = events[int(keep[j])]
        tid[j] = int(e.device_resource_id())
        device[j] = int(e.device_index())
    py_id = np.full(len(keep), -1, np.int64)
    py_parent = np.full(len(keep), -1, np.int64)
    py_rows = np.flatnonzero(kind == int(EventKind.PYTHON))
    gc_name = name_ids.get("Python GC", -2)
    for lo in range(0, len(py_rows), CHUNK):  # tracer mode only
        rows = py_rows[lo:lo + CHUNK]
        chunk = [events[i] for i in keep[rows].tolist()]
        if not hasattr(chunk[0], "python_id"):  # torch 2.11: no tracer ids; the rows keep no parents
            tick(len(rows))
            continue
        is_fn = np.array([e.is_python_function() for e in chunk], bool)
        fn_rows = rows[is_fn]
        py_id[fn_rows] = [e.python_id() for e, f in zip(chunk, is_fn.tolist(), strict=True) if f]
        py_parent[fn_rows] = [e.python_parent_id() for e, f in zip(chunk, is_fn.tolist(), strict=True) if f]
        other = rows[~is_fn]
        kind[other] = np.where(name_col[keep[other]] == gc_name, int(EventKind.GC), int(EventKind.OTHER))
        tick(len(rows))
    if undecodable:
        log.warning("%d profiler events had undecodable names (kept as '%s')", undecodable, UNDECODABLE)
    if main_rf is None:
        log.warning("window marker missing from the profile: training-thread events keep RecordFunction ids")
    table = list(name_ids)
    gpu_kinds = np.isin(kind_of_act, (int(EventKind.KERNEL), int(EventKind.MEMCPY), int(EventKind.MEMSET)))
    gpu_events = int(gpu_kinds[act_col].sum()) if n else 0
    launch_ids = np.array([i for x, i in name_ids.items() if x.startswith(LAUNCH_PREFIXES)], np.int64)
    runtime = np.isin(act_col, [i for a, i in act_ids.items() if a in ("cuda_runtime", "cuda_driver")])
    launches = int((runtime & np.isin(name_col, launch_ids)).sum()) if n else 0
    return KinetoRows(kind=kind, name_idx=name_col[keep], name_table=table, tid=tid, device=device,
                      start_ns=k_start, end_ns=np.maximum(k_end, k_start), python_id=py_id,
                      python_parent_id=py_parent, launches=launches, gpu_events=gpu_events)


# CUDA calls that put work on the GPU (each gives a kernel, memcpy or memset event when CUPTI records)
LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch", "cudaMemcpy", "cuMemcpy",
                   "cudaMemset", "cuMemset")


def gpu_events_lost(rows: KinetoRows) -> str:
    """Why the window's GPU events are missing, or "": the training thread launched work on the GPU
    and the profile holds no kernel, memcpy or memset. Such a window is not a CPU window: CUPTI lost
    its GPU activity (a later window after a CUPTI teardown, full activity buffers); summarized, it
    would blame the host for what the GPU did."""
    if rows.launches > 0 and rows.gpu_events == 0:
        return (f"GPU events lost: {rows.launches} CUDA launches and no kernel, memcpy or memset in the "
                "profile (CUPTI recorded no GPU activity)")
    return ""


CUDA_GRAPH_SAFE_CUDA = (12, 6)  # torch's own bound: below it, no CUPTI teardown where CUDA graphs run


def cupti_env(cuda_version: str | None, cuda_graphs: bool) -> dict[str, str]:
    """The CUPTI settings torch's own profiler sets before a trace (torch/profiler/profiler.py,
    ``prepare_trace``; read in torch 2.13 and 2.3.1): with CUDA graphs on CUDA < 12.6, no lazy
    re-init and no teardown (CUPTI teardown with graphs crashes at the first lazy re-init on CUDA
    11 and at the second re-init on CUDA 12). Elsewhere Kineto's default (teardown after each
    window: no lasting CUPTI overhead between windows)."""
    if not cuda_graphs or not cuda_version:
        return {}
    try:
        major, minor = (int(x) for x in cuda_version.split(".")[:2])
    except ValueError:
        return {}
    if (major, minor) >= CUDA_GRAPH_SAFE_CUDA:
        return {}
    return {"DISABLE_CUPTI_LAZY_REINIT": "1", "TEARDOWN_CUPTI": "0"}


def cuda_graphs_in_use() -> bool:
    """Whether this process may run CUDA graphs, as torch judges it (inductor's ``triton.cudagraphs``,
    read only where inductor is already imported), or as the user says (PERFTRACKER_CUDA_GRAPHS=1:
    graphs captured by hand with ``torch.cuda.graph`` leave no flag to read)."""
    if os.environ.get("PERFTRACKER_CUDA_GRAPHS", "") == "1":
        return True
    cfg = sys.modules.get("torch._inductor.config")
    try:
        return bool(cfg is not None and cfg.triton.cudagraphs)
    except AttributeError:
        return False
