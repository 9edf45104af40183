"""The profile window's shared state: its states, options, result and the record of the window in
progress (``_Active``). ``ProfileWindow`` (perftracker/runtime/window/profile.py) owns the transitions,
its ``WindowWriter`` (window_writer.py) writes the file, ``WindowExit`` (window_exit.py) ends it at
exit, ``window_instruments.py`` starts and releases what records it; all of them read these.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perftracker.runtime import stack_sampler as stacks_mod
from perftracker.runtime.profiler import KinetoCapture
from perftracker.runtime.sampler_process import SamplerProcess

# The window's states. ProfileWindow (perftracker/runtime/window/profile.py) owns the transitions; the exit path
# (perftracker/runtime/window/exit.py) reads them too. The training thread compares them with ``is``.
_IDLE, _ARMED, _ACTIVE, _FINISHING = "idle", "armed", "active", "finishing"
_OVERRUN = "overrun"  # no boundary came to close the window: abandoned, profiler waits for the next one


@dataclass(frozen=True)
class WindowOptions:
    # "sample": stack sampler thread; "remote": read by the sampler process from outside (needs
    # spawn_sampler; else, or where perftracker/remote_stacks.py cannot calibrate, as "sample");
    # "tracer": torch's Python tracer; "off"
    stacks: str = "sample"
    stack_period_us: int = 1000
    # "sample" on CPython 3.11: the sampler thread reads the stack's memory (no frame objects of the
    # training thread, see perftracker/runtime/stack_sampler.py); False walks frame objects (tests compare the two)
    stack_reader: bool = True
    switch_interval_s: float = 0.001  # sys.setswitchinterval inside the window with the sampler thread (0: leave as is)
    record_gc: bool = True
    nvtx: bool = True
    spawn_sampler: bool = False  # run `python -m perftracker.agent.samplers` for this window ourselves
    sampler_args: tuple[str, ...] = ()  # extra CLI args for it, e.g. ("--gpu-index", "0")
    sampler_ready_timeout_s: float = 15.0  # open the window without samples after this long
    # "fork" (default): a forked child process converts and writes the file (the training process
    # keeps the profiler result until the child succeeds, and converts it in a throttled thread if
    # the child fails, hangs or is killed; a process with RDMA memory that is not fork-protected
    # uses the thread, perftracker/runtime/fork_safety.py); "thread": a throttled thread in the
    # training process does it (torch's events() then holds the GIL for seconds in that thread)
    writer: str = "fork"
    writer_duty: float = 0.25  # the writer thread's share of the GIL (see perftracker/runtime/throttle.py)
    writer_nice: int = 10  # the writer thread's OS nice value (19 starved it for minutes on a loaded node)
    child_nice: int = 19  # the conversion child's nice value ("fork"); it also runs SCHED_IDLE
    child_soft_s: float = 30.0  # a child still converting after this long is reniced to writer_nice
    child_timeout_s: float = 60.0  # ... and killed after this long; a thread then writes the window
    # CPUs for perftracker's helpers (sampler process, conversion child, writer and stack-sampler
    # threads); () leaves them on the training process's own CPUs
    helper_cpus: tuple[int, ...] = ()
    # at interpreter exit: longest wait for the window to be written at full speed and handed to the
    # agent (perftracker/runtime/window/exit.py); PERFTRACKER_EXIT_DELAY_S for the agent's windows
    exit_wait_s: float = 7.0
    # at interpreter exit, hand the window to a child process that writes it after this one has gone
    # (perftracker/runtime/window/handoff.py, issue 30); False: write it here within exit_wait_s
    exit_handoff: bool = True
    # end the window once its phases have converged (perftracker/runtime/convergence.py, issue 30);
    # window_s stays the upper bound (default, see docs/profile-window.md). False: always window_s
    converge: bool = True
    # the most profiler events a window may hold (issue 43): a kernel-dense GPU job fills Kineto's
    # activity buffers within a long window (collection stops, or older CUPTI crashes) and its
    # conversion takes minutes. After a first window, the events per iteration it held bound the
    # next windows' length: a window ends at the boundary where it would pass this, logged as cut.
    # 0: no bound. A reasoned default, not measured on a GPU (bench/gpu_probe.py's kernel_dense_window).
    max_window_events: int = 2_000_000
    converge_min_iterations: int = 20
    converge_tolerance: float = 0.10
    converge_min_s: float = 5.0  # convergence.MIN_S
    overrun_s: float = 60.0  # no closing boundary this long after window_s: abandon (the agent waits as long)
    # Test seam, None in production: called in the writer thread with the exit event (set as soon as
    # the process starts exiting, or shutdown() cancels the writer) before it writes the file, so
    # that a test can hold the window in "finishing" for as long as it needs (e.g.
    # ``lambda exiting: exiting.wait(30)``: until the exit path hurries or cancels the writer).
    writer_gate: Callable[[threading.Event], None] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class WindowResult:
    session: str
    raw_path: Path | None
    start_ns: int
    end_ns: int
    error: str = ""
    samples_path: Path | None = None
    blocking_ns: int = 0  # main-thread time spent stopping the window
    iterations: int = 0
    rows: int = 0
    # a detached child writes ``raw_path`` after this process has gone (at exit, issue 30): the file
    # is whole once it exists; "<raw_path>.error" says why it never will (window_handoff.py)
    writer_pid: int = 0


@dataclass
class _Active:
    session: str
    window_ns: int
    on_done: Callable[[WindowResult], None]
    armed_ns: int
    sampler: SamplerProcess | None = None
    capture: KinetoCapture | None = None
    stack_sampler: stacks_mod.StackSampler | None = None
    pystacks_path: Path | None = None  # stacks="remote": the sampler process's stack file
    gc: stacks_mod.GcRecorder = field(default_factory=stacks_mod.GcRecorder)
    start_ns: int = 0
    boundaries_ns: list[int] = field(default_factory=list)
    step_ns: list[int] = field(default_factory=list)  # each iteration's optimizer step (0: none seen)
    end_reason: str = ""  # "converged", "window_s", "event_bound" or "exit" (why the window ended)
    old_switch_s: float = 0.0
    nvtx_window: Any = None
    nvtx_iter_open: bool = False
    thread_ident: int = 0  # the thread that started the profiler (the only one that can stop it)
    # why this process must not fork a conversion child ("" when it may; fork_safety.py), set at arm
    fork_unsafe: str = ""
    watchdog: threading.Timer | None = None
    overrun_done: threading.Event = field(default_factory=threading.Event)
