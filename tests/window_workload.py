"""The training loop of the profile-window tests, with its ground truth.

``outer()`` spins 30 ms and calls ``inner()`` (10 ms and a small matmul); ``other()`` spins 10 ms.
Each call appends (function, start_ns, end_ns) to CALLS, against which the sampled Python
executions of a window are checked: their structure in tests/component/test_window.py and
tests/system/test_remote_stacks.py, how closely they match the calls in
tests/accuracy/test_stack_sampling.py.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from perftracker.model.raw_window import EventKind, RawWindow, WindowMeta
from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult


class Ident:
    rank, world_size, local_rank, host, job = 3, 4, 1, "h", "j"
    pid = os.getpid()
    training_tid = threading.get_native_id()


def spin(ms: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < ms / 1000:
        pass


CALLS: list[tuple[str, int, int]] = []  # ground truth: (function, start_ns, end_ns) of every call


def outer() -> None:  # 30 ms self + inner()
    t0 = time.monotonic_ns()
    spin(30)
    inner()
    CALLS.append(("outer", t0, time.monotonic_ns()))


def inner() -> None:
    t0 = time.monotonic_ns()
    spin(10)
    torch.ones(64, 64).matmul(torch.ones(64, 64))
    CALLS.append(("inner", t0, time.monotonic_ns()))


def other() -> None:
    t0 = time.monotonic_ns()
    spin(10)
    CALLS.append(("other", t0, time.monotonic_ns()))


def drive(win: ProfileWindow, done: list[WindowResult], limit_s: float = 90.0,
          body: Callable[[], object] | None = None) -> int:
    """Train until the window armed now has delivered its result."""
    it = 0
    want = len(done) + 1
    deadline = time.monotonic() + limit_s
    while len(done) < want and time.monotonic() < deadline:
        (body or (lambda: (outer(), other())))()
        it += 1
        win.on_boundary(time.monotonic_ns(), it)
    return it


def no_profiler_state(before_switch: float, callbacks_before: int) -> None:
    assert not torch.autograd.profiler._is_profiler_enabled
    assert not torch._C._autograd._profiler_enabled()
    assert sys.getswitchinterval() == pytest.approx(before_switch)
    assert len(gc.callbacks) == callbacks_before
    assert not [t for t in threading.enumerate() if t.name == "perftracker-stack-sampler"]


def window_with_stacks(tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
                       reader: bool) -> tuple[ProfileWindow, list[WindowResult], list[int]]:
    """A 1.5 s window with the in-process stack sampler (reading the stack's memory, or walking the
    frame objects when ``reader`` is False), trained through with a young-generation GC pause
    inside; a second trigger is refused while it is armed and while it is active. Returns the
    window, its results and the threads that asked for the frame objects."""
    frames_asked: list[int] = []
    real_current_frames = sys._current_frames

    def current_frames() -> dict:  # type: ignore[type-arg]
        frames_asked.append(threading.get_ident())
        return real_current_frames()

    monkeypatch.setattr(sys, "_current_frames", current_frames)
    win = ProfileWindow(Ident(), tmp_path, options=WindowOptions(stack_reader=reader))
    done: list[WindowResult] = []
    assert win.arm("s1", 1.5, done.append)
    with caplog.at_level(logging.WARNING, logger="perftracker.runtime.window.profile"):
        assert not win.arm("s2", 1.0, done.append)  # armed, not started: still refused
    assert "ignored" in caplog.text and "s2" in caplog.text
    seen_active = False

    def body() -> None:
        nonlocal seen_active
        outer()
        other()
        if win.state == "active" and not seen_active:
            seen_active = True
            assert not win.arm("s3", 1.0, done.append)  # a second trigger during the window
            gc.collect(0)  # a (young-generation) GC pause inside the window

    drive(win, done, body=body)
    assert seen_active and len(done) == 1
    return win, done, frames_asked


def remote_stacks_window(tmp_path: Path, fallback: bool = False) -> tuple[RawWindow, WindowResult]:
    """A 1.5 s window whose Python stacks the sampler process reads from outside (``fallback``: the
    in-process sampler thread takes over)."""
    win = ProfileWindow(Ident(), tmp_path, options=WindowOptions(stacks="remote", spawn_sampler=True))
    done: list[WindowResult] = []
    CALLS.clear()
    assert win.arm("r", 1.5, done.append)
    threads: set[str] = set()

    def body() -> None:
        outer()
        other()
        if win.state == "active":
            threads.update(t.name for t in threading.enumerate())

    drive(win, done, body=body)
    res = done[0]
    assert threads and ("perftracker-stack-sampler" in threads) == fallback
    assert res.error == "" and res.raw_path is not None and res.samples_path is not None
    return RawWindow.load(res.raw_path), res


def executions(raw: RawWindow, func: str) -> np.ndarray:
    """The Python rows of this module's ``func`` (a boolean mask over the window's rows)."""
    ids = [i for i, n in enumerate(raw.names) if n.endswith(f": {func}") and __file__ in n]
    return (raw.col("kind") == EventKind.PYTHON) & np.isin(raw.col("name_id"), ids)


def true_share(func: str, m: WindowMeta) -> float:
    """The share of the window that the calls of ``func`` took, from CALLS."""
    lo, hi = m.window_start_ns, m.window_end_ns
    return sum(max(0, min(e, hi) - max(s, lo)) for f, s, e in CALLS if f == func) / m.window_ns
