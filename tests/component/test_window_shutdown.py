"""A profile window that perftracker stops in this process: deactivate() during a window, shutdown()
with a cancelled or a stuck writer, a hang in the middle of a window and an exit during an abandoned
one (a training process that ends while a window is open, end to end: tests/system/test_window_exit.py).

No test here races the writer thread or the iteration boundaries against the wall clock: the tests
drive boundaries by hand against a FakeClock (so a boundary opens or closes the window because the
test said so), hold the writer with ``WindowOptions.writer_gate`` for as long as they need it in
"finishing", and wait on the delivery callback instead of sleeping."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from perftracker.clock import FakeClock
from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult


class _Ident:
    rank, world_size, local_rank, host, job = 0, 1, 0, "h", "j"
    pid = 0
    training_tid = threading.get_native_id()


def _boundary(win: ProfileWindow, clock: FakeClock, i: int, advance_s: float = 0.0) -> None:
    """One training iteration: some work for the profiler, then a boundary at the fake clock's time.
    The window reads the fake clock, so whether this boundary starts, continues or ends the window
    follows from ``advance_s`` alone, never from how fast this machine runs."""
    torch.ones(32, 32).matmul(torch.ones(32, 32))
    clock.advance_s(advance_s)
    win.on_boundary(clock.now_ns(), i)


def _start(win: ProfileWindow, clock: FakeClock) -> None:
    clock.t_ns = max(clock.t_ns, time.monotonic_ns())  # timestamps near the profiler's own
    _boundary(win, clock, 0)  # no sampler process to wait for: the first boundary opens the window
    assert win.state == "active", win.state


def _end(win: ProfileWindow, clock: FakeClock, window_s: float) -> None:
    _boundary(win, clock, 1, 0.01)
    assert win.state == "active", win.state
    _boundary(win, clock, 2, window_s)  # the first boundary after window_s closes the window
    assert win.state in ("finishing", "idle"), win.state  # (idle: an ungated writer already delivered)


def _recorder() -> tuple[list[WindowResult], threading.Event, Callable[[WindowResult], None]]:
    done: list[WindowResult] = []
    delivered = threading.Event()

    def on_done(res: WindowResult) -> None:
        done.append(res)
        delivered.set()

    return done, delivered, on_done


def _stack_sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "perftracker-stack-sampler"]


def test_deactivate_stops_an_open_window(tmp_path: Path, clean_env: dict[str, str]) -> None:
    from perftracker.config import Config
    from perftracker.runtime import runtime as rt_mod

    switch = sys.getswitchinterval()
    clock = FakeClock(time.monotonic_ns())
    rt = rt_mod.activate(Config.from_env(autostart_agent=False))
    try:
        win = ProfileWindow(_Ident(), tmp_path, clock=clock, runtime=rt)
        done: list[WindowResult] = []
        assert win.arm("d1", 60.0, done.append)
        _start(win, clock)
        _boundary(win, clock, 1, 1.0)
        assert win.state == "active" and torch._C._autograd._profiler_enabled()
    finally:
        rt_mod.deactivate()  # in the training thread, as a training script would
    assert not torch._C._autograd._profiler_enabled()
    assert sys.getswitchinterval() == pytest.approx(switch)
    assert not _stack_sampler_threads()
    assert win.state == "idle" and len(done) == 1 and done[0].error.startswith("discarded: perftracker deactivated")
    assert done[0].raw_path is None and not list(tmp_path.glob("*.raw.npz"))
    # an armed (not yet started) window is cancelled too, and the window can be used again afterwards
    assert win.arm("d2", 60.0, done.append)
    rt = rt_mod.activate(Config.from_env(autostart_agent=False))
    rt_mod.deactivate()
    assert win.state == "idle" and len(done) == 2 and "discarded" in done[1].error
    assert win.arm("d3", 0.05, done.append)
    _start(win, clock)
    _end(win, clock, 0.05)
    assert win.wait(60) and len(done) == 3 and done[2].error == "" and done[2].raw_path is not None, done
    assert not torch._C._autograd._profiler_enabled()


@pytest.mark.timeout(60)
def test_shutdown_waits_for_a_cancelled_writer(tmp_path: Path) -> None:
    reached = threading.Event()

    def gate(cancel: threading.Event) -> None:  # hold the writer until the exit path cancels it
        reached.set()
        cancel.wait(30)

    clock = FakeClock(time.monotonic_ns())
    win = ProfileWindow(_Ident(), tmp_path, clock=clock,
                        options=WindowOptions(writer_duty=0.01, spawn_sampler=False, writer_gate=gate))
    done, delivered, on_done = _recorder()
    assert win.arm("w1", 1.0, on_done)
    _start(win, clock)
    _end(win, clock, 1.0)
    assert reached.wait(30) and win.state == "finishing" and not done
    assert not torch._C._autograd._profiler_enabled()  # the training thread stopped it already
    t0 = time.monotonic()
    win.shutdown("process exiting", writer_wait_s=20.0)
    assert time.monotonic() - t0 < 20.0
    assert not win.writer.thread.is_alive()  # shutdown returned once the writer ended, not at the limit
    assert win.state == "idle" and len(done) == 1, (win.state, done)
    assert done[0].error == "discarded: process exiting" and done[0].raw_path is None, done
    assert not list(tmp_path.glob("*.raw.npz"))


@pytest.mark.timeout(60)
def test_shutdown_waits_for_a_stuck_writer_at_most_writer_wait_s(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    reached, release = threading.Event(), threading.Event()

    def gate(cancel: threading.Event) -> None:  # a writer that does not get to a cancel check
        reached.set()
        release.wait(30)

    clock = FakeClock(time.monotonic_ns())
    win = ProfileWindow(_Ident(), tmp_path, clock=clock,
                        options=WindowOptions(spawn_sampler=False, exit_wait_s=0.3, writer_gate=gate))
    done, delivered, on_done = _recorder()
    assert win.arm("w2", 1.0, on_done)
    _start(win, clock)
    _end(win, clock, 1.0)
    assert reached.wait(30)
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="perftracker.runtime.window.profile"):
        win.shutdown("process exiting", writer_wait_s=win.options.exit_wait_s)
    waited_s = time.monotonic() - t0
    assert 0.25 <= waited_s < 10.0, waited_s  # (the upper bound is generous: 2 loaded cores)
    assert win.state == "finishing" and not done
    assert any("writer still busy after 0.3 s" in r.getMessage() for r in caplog.records), caplog.text
    release.set()  # the writer goes on, sees the cancel and discards the window: one result
    assert delivered.wait(30) and win.wait(30)
    assert len(done) == 1 and done[0].error == "discarded: process exiting", done


@pytest.mark.timeout(60)
def test_a_hang_mid_window_is_abandoned_and_the_next_boundary_cleans_up(tmp_path: Path) -> None:
    switch = sys.getswitchinterval()
    clock = FakeClock(time.monotonic_ns())
    # the watchdog is a real timer (window_s + overrun_s); 2 s keeps it well clear of h3's two
    # back-to-back boundaries below
    win = ProfileWindow(_Ident(), tmp_path, clock=clock, options=WindowOptions(overrun_s=2.0))
    done, delivered, on_done = _recorder()
    assert win.arm("h1", 0.2, on_done)
    _start(win, clock)
    assert delivered.wait(30)  # the training thread "hangs": no boundary until the watchdog fired
    assert win.state == "overrun" and len(done) == 1, (win.state, done)
    assert done[0].error.startswith("abandoned: no iteration boundary") and done[0].raw_path is None
    assert not _stack_sampler_threads()  # sampler stopped
    assert sys.getswitchinterval() == pytest.approx(switch)
    assert torch._C._autograd._profiler_enabled()  # only the training thread can stop it ...
    assert not win.arm("h2", 0.2, on_done)  # ... so no new window until then
    _boundary(win, clock, 10**6, 30.0)  # training resumes
    assert win.state == "idle" and not torch._C._autograd._profiler_enabled(), win.state
    assert len(done) == 1 and not list(tmp_path.glob("*.raw.npz")), done  # dropped, reported once
    assert win.arm("h3", 0.05, on_done)  # usable again, and a normal window is not abandoned
    _start(win, clock)
    _end(win, clock, 0.05)
    assert win.wait(60), win.state
    assert len(done) == 2 and done[1].error == "" and done[1].raw_path is not None, done


@pytest.mark.timeout(60)
def test_exit_during_an_abandoned_window_stops_the_profiler(tmp_path: Path) -> None:
    clock = FakeClock(time.monotonic_ns())
    win = ProfileWindow(_Ident(), tmp_path, clock=clock, options=WindowOptions(overrun_s=0.5))
    done, delivered, on_done = _recorder()
    assert win.arm("h4", 0.1, on_done)
    _start(win, clock)
    assert delivered.wait(30)  # the watchdog abandoned it
    assert win.state == "overrun" and torch._C._autograd._profiler_enabled()
    win.shutdown("process exiting", writer_wait_s=1.0)  # the exit hook, in the training thread
    assert win.state == "idle" and not torch._C._autograd._profiler_enabled() and len(done) == 1
    assert done[0].error.startswith("abandoned:"), done
