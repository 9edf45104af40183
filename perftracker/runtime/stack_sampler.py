"""Python call stacks of the training thread, by sampling, plus garbage-collector pauses.

``StackSampler`` is a daemon thread in the training process that reads the training thread's
stack every ``period_us`` (1 ms by default): from the process's own memory on CPython 3.11
(perftracker/remote_stacks.py; walking frame objects from another thread crashes 3.11 now and
then), from ``sys._current_frames()`` elsewhere. The main thread does no
work for it: only the GIL hand-over, which is free while the main thread runs torch ops (they
release the GIL) and bounded by ``sys.setswitchinterval`` while it runs pure Python. Each sample
keeps ``(id(frame), code)`` per level; frames are never kept alive (their locals could be tensors).

``python_executions`` turns samples into executions: a function's execution at depth d lasts as
long as consecutive samples show the same frame object (same id and code) at depth d with the
same callers. Start and end are the midpoints between the last sample without it and the first
with it (and vice versa), so they are exact to half the sampling period. A gap much longer than the
period means the sampler could not get the GIL: the training thread sat in one GIL-holding C call
(a GC pass, a C extension), made by the stack seen right after the gap, so a long gap goes to that
stack and the stack before it ends one period after its last sample. A function called many
times within one period shows as one execution: its (β, μ, σ) stay right, only its count does not.

**Samples hold few collector-tracked objects.** Each distinct stack is kept once and a sample is
an index into those (an ``array``, which the collector does not track). A tuple per sample and per
level (``(id(frame), code)``) would keep about 30 tracked tuples per millisecond alive in a deep
stack: some 90,000 over a 3 s window, which the collector promotes to its oldest generation until
they pass a quarter of it and start a full collection of the whole training process. On a 2-rank
FSDP2 job under torchrun (about 300,000 tracked objects per rank after ``import torch``) that
full collection ran inside the window, on the sampler thread, for 0.3-1.0 s at load 7, holding
the GIL: one rank's window held 10-19% "Python GC" and the report named it, with its peer's wait,
instead of the rank's extra matrix products (issue 31).

``GcRecorder`` records collector pauses (``gc.callbacks``) on the same clock.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)

Sample = tuple[tuple[int, CodeType], ...]  # (id(frame), code), innermost first


def frame_name(code: CodeType) -> str:
    """Kineto's python_function naming: ``file(first line): name``."""
    return f"{code.co_filename}({code.co_firstlineno}): {code.co_name}"


class StackReader(Protocol):
    """Reads one thread's stack, innermost first, as (frame address, code) pairs; None for a read
    the thread tore (perftracker.remote_stacks.RemoteStackReader)."""

    def sample(self) -> tuple[tuple[int, Any], ...] | None: ...


class StackSampler:
    """Samples one thread's Python stack from a helper thread in the same process.

    With a ``reader`` (CPython 3.11: a ``RemoteStackReader`` on this very process) the thread reads
    the stack's memory with ``process_vm_readv`` and never holds a frame object of the training
    thread. Walking such frames (``f_back``) from another thread is what crashes 3.11 now and then
    (docs/profile-window.md, "Stack sampling on CPython 3.11"); a bad read there is an error, not
    a crash."""

    def __init__(self, thread_ident: int, period_us: int = 1000, cpus: tuple[int, ...] = (),
                 reader: StackReader | None = None) -> None:
        self.thread_ident = thread_ident
        self.reader = reader  # reads the stack from memory instead of frame objects (CPython 3.11)
        self.cpus = cpus
        self.period_ns = period_us * 1000
        self.t_ns: list[int] = []
        self.stacks: list[Sample] = []  # each distinct stack once
        self.stack_of_sample = array("q")  # per sample, its stack in ``stacks`` (untracked by the collector)
        self._stack_ids: dict[Any, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="perftracker-stack-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():
                log.warning("stack sampler thread did not stop within 5 s")
            self._thread = None

    @property
    def samples(self) -> list[Sample]:
        """The samples, one stack per ``t_ns`` (the interned stacks, not copies); read after ``stop``."""
        stacks = self.stacks
        return [stacks[i] for i in self.stack_of_sample]

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _frames_keyed(self) -> tuple[Sample, tuple[int, ...]]:
        """The stack by walking the thread's frame objects (not on CPython 3.11, see the class doc),
        and its key: frame and code ids (code objects compare by content, so two functions alike in
        all but their file would share a stack keyed by the codes)."""
        frame = sys._current_frames().get(self.thread_ident)
        stack = []
        ids: list[int] = []
        while frame is not None:
            code = frame.f_code
            fid = id(frame)
            stack.append((fid, code))
            ids.append(fid)
            ids.append(id(code))
            frame = frame.f_back
        del frame
        return tuple(stack), tuple(ids)

    def _remote_keyed(self) -> tuple[Sample | None, Any]:
        """The reader's stack, its own key (a RemoteCode compares by identity)."""
        assert self.reader is not None
        got = self.reader.sample()
        return got, got

    def _run(self) -> None:
        try:  # keep the ticks on time on a busy node; needs CAP_SYS_NICE, optional
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
        except (OSError, AttributeError):
            pass
        if self.cpus:
            try:
                os.sched_setaffinity(threading.get_native_id(), self.cpus)
            except (OSError, AttributeError, ValueError):
                pass
        read = self._remote_keyed if self.reader is not None else self._frames_keyed
        t_list, ids, stacks, stack_ids = self.t_ns, self.stack_of_sample, self.stacks, self._stack_ids
        period = self.period_ns
        next_ns = time.monotonic_ns()
        try:
            while not self._stop.is_set():
                got, key = read()
                now = time.monotonic_ns()
                if got is not None:  # None: the stack changed while the reader read it, a one-sample gap
                    i = stack_ids.get(key)
                    if i is None:
                        i = stack_ids[key] = len(stacks)
                        stacks.append(got)
                    t_list.append(now)
                    ids.append(i)
                next_ns += period
                sleep_ns = next_ns - time.monotonic_ns()
                if sleep_ns > 0:
                    time.sleep(sleep_ns / 1e9)
                else:
                    next_ns = time.monotonic_ns()
        except Exception:  # never let the sampler take anything down
            log.exception("stack sampler failed; the window keeps the samples taken so far")


@dataclass
class GcRecorder:
    """Collector pauses as (start_ns, end_ns, generation) via gc.callbacks."""

    pauses: list[tuple[int, int, int]] = field(default_factory=list)
    _start_ns: int = 0
    _installed: bool = False

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start_ns = time.monotonic_ns()
        elif self._start_ns:
            self.pauses.append((self._start_ns, time.monotonic_ns(), int(info.get("generation", -1))))
            self._start_ns = 0

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def remove(self) -> None:
        if self._installed:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass
            self._installed = False


@dataclass(frozen=True)
class PythonExecutions:
    """Executions built from stack samples; codes index into ``codes``."""

    start_ns: np.ndarray  # int64
    end_ns: np.ndarray  # int64
    depth: np.ndarray  # int32, 0 = outermost
    parent: np.ndarray  # int32, index of the enclosing execution, -1 at depth 0
    stack: list[tuple[CodeType, ...]]  # per execution: the call stack, outermost first, itself last


LONG_GAP_PERIODS = 3


def python_executions(
    t_ns: list[int] | np.ndarray, samples: list[Sample], lo_ns: int, hi_ns: int, period_ns: int = 1_000_000,
    tick: Callable[[], None] | None = None,
) -> PythonExecutions:
    """Turn stack samples into nested executions clipped to [lo_ns, hi_ns]."""
    t = [int(x) for x in t_ns]
    n = len(t)
    starts: list[int] = []
    ends: list[int] = []
    depths: list[int] = []
    parents: list[int] = []
    stacks: list[tuple[CodeType, ...]] = []
    open_rows: list[int] = []  # row index per depth of the currently open executions
    prev: tuple[tuple[int, CodeType], ...] = ()
    for i in range(n):
        if tick is not None:
            tick()
        cur = tuple(reversed(samples[i]))  # outermost first
        k = 0
        limit = min(len(cur), len(prev))
        while k < limit and cur[k][0] == prev[k][0] and cur[k][1] is prev[k][1]:
            k += 1
        if i == 0:
            edge = lo_ns
        elif t[i] - t[i - 1] > LONG_GAP_PERIODS * period_ns:
            edge = t[i - 1] + period_ns
        else:
            edge = (t[i - 1] + t[i]) // 2
        for row in open_rows[k:]:
            ends[row] = edge
        del open_rows[k:]
        for d in range(k, len(cur)):
            row = len(starts)
            starts.append(edge)
            ends.append(edge)
            depths.append(d)
            parents.append(open_rows[d - 1] if d > 0 else -1)
            stacks.append(tuple(c for _, c in cur[: d + 1]))
            open_rows.append(row)
        prev = cur
    last = hi_ns if n else lo_ns
    for row in open_rows:
        ends[row] = last
    s = np.clip(np.array(starts, np.int64), lo_ns, hi_ns)
    e = np.clip(np.array(ends, np.int64), lo_ns, hi_ns)
    return PythonExecutions(s, e, np.array(depths, np.int32), np.array(parents, np.int32), stacks)
