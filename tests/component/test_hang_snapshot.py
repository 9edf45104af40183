"""Hang snapshots: the training thread's stack, call in progress, kernel state and counters (in real
gloo jobs: tests/system/test_hang_snapshot_gloo.py)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from perftracker.clock import FakeClock
from perftracker.model import Frame, HangSnapshot
from perftracker.runtime.hang_capture import (
    callee_of,
    normalize_path,
    recognise_collective,
    take_snapshot,
)

REPO = Path(__file__).resolve().parents[2]


def _runtime(clock: FakeClock | None = None, last: tuple[str, int] | None = ("optimizer.step", 0)) -> SimpleNamespace:
    ident = SimpleNamespace(rank=2, world_size=4, local_rank=2, host="hostA", pid=os.getpid(),
                            training_tid=threading.main_thread().native_id, job="job1")
    return SimpleNamespace(identity=ident, iteration=301, clock=clock, last_event=lambda: last)


def _stuck_in_forward(started: threading.Event, release: threading.Event) -> None:
    started.set()
    release.wait(10)  # the "training thread" blocks here


def test_snapshot_of_a_blocked_thread_from_another_thread() -> None:
    clock = FakeClock(start_ns=50 * 10**9)
    rt = _runtime(clock, ("optimizer.step", 38 * 10**9))
    started, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=_stuck_in_forward, args=(started, release))
    worker.start()
    try:
        started.wait(5)
        time.sleep(0.05)
        rt.identity.training_tid = worker.native_id
        snap = take_snapshot(rt, session="s9")
    finally:
        release.set()
        worker.join()
    assert snap.rank == 2 and snap.world_size == 4 and snap.job == "job1" and snap.host == "hostA"
    assert snap.session == "s9" and snap.last_iteration == 301 and snap.last_event == "optimizer.step"
    assert snap.idle_s == pytest.approx(12.0)
    # outermost first, user frames relative to the cwd (the repo root under pytest) or absolute
    funcs = [f.function for f in snap.stack]
    assert funcs[-3:] == ["_stuck_in_forward", "wait", "wait"] and funcs[0] == "_bootstrap"  # Event/Condition
    assert snap.stack[0].file == "<stdlib>/threading.py" and snap.stack[-1].file == "<stdlib>/threading.py"
    assert snap.stack[-3].file.endswith("tests/component/test_hang_snapshot.py") and not snap.stack[-3].file.startswith("/")
    assert snap.current_op == "release.wait"  # the call in progress at the innermost user frame
    assert snap.kernel_state.startswith("S")  # sleeping on a futex (threading.Event)
    assert HangSnapshot.from_dict(json.loads(json.dumps(snap.to_dict()))) == snap


def test_snapshot_never_raises_on_a_broken_runtime() -> None:
    def boom() -> None:
        raise RuntimeError("runtime bug")

    rt = SimpleNamespace(identity=None, iteration="x", last_event=boom)
    snap = take_snapshot(rt)
    assert snap.last_iteration == -1 and snap.idle_s == 0.0 and snap.last_event == ""
    assert snap.stack and snap.stack[-1].function  # the main thread's stack (this test)
    rt2 = _runtime(last=None)
    assert take_snapshot(rt2).idle_s == 0.0


def test_snapshot_is_fast() -> None:
    rt = _runtime(FakeClock(10**9))
    take_snapshot(rt)
    t0 = time.perf_counter()
    for _ in range(20):
        take_snapshot(rt)
    assert (time.perf_counter() - t0) / 20 < 0.05


def test_callee_of() -> None:
    assert callee_of("time.sleep(100)") == "time.sleep"
    assert callee_of("m(x).sum()") == "m(x).sum"
    assert callee_of("torch.save({'a': (1, 2)}, path)") == "torch.save"
    assert callee_of("loader") == ""
    assert callee_of("f(") == ""


def test_normalize_path() -> None:
    assert normalize_path("/usr/lib/python3/dist-packages/torch/autograd/graph.py") == "<lib>/torch/autograd/graph.py"
    assert normalize_path("/x/venv/lib/python3.11/site-packages/perftracker/hooks.py") == "<perftracker>/hooks.py"
    assert normalize_path(str(REPO / "perftracker" / "runtime" / "hooks.py")) == "<perftracker>/runtime/hooks.py"
    # the demo job shipped in the package is user code, installed or not
    assert normalize_path(str(REPO / "perftracker" / "examples" / "train.py")) == "perftracker/examples/train.py"
    assert normalize_path("/v/lib/python3.11/site-packages/perftracker/examples/train.py") == \
        "perftracker/examples/train.py"
    assert normalize_path(threading.__file__) == "<stdlib>/threading.py"
    assert normalize_path(os.path.join(os.getcwd(), "examples", "train.py")) == "examples/train.py"
    assert normalize_path("<frozen runpy>") == "<frozen runpy>"


def test_recognise_collective_only_inside_the_innermost_user_frame() -> None:
    user = Frame("train.py", 10, "step")
    ddp = [Frame("<lib>/torch/nn/modules/module.py", 1, "_call_impl"),
           Frame("<lib>/torch/nn/parallel/distributed.py", 2, "forward")]
    # sleeping in user forward under DDP.forward: not a collective
    assert recognise_collective([user, *ddp, Frame("train.py", 88, "forward")], "time.sleep", "S hrtimer_nanosleep", True) == ""
    # DDP syncing buffers in its forward: a collective
    assert recognise_collective([user, *ddp, Frame("<lib>/torch/nn/parallel/distributed.py", 3, "_sync_buffers")],
                                "", "S futex_do_wait", True) == "c10d sync_buffers (DDP)"
    backward = [user, Frame("<lib>/torch/_tensor.py", 623, "backward"),
                Frame("<lib>/torch/autograd/graph.py", 979, "_engine_run_backward")]
    assert recognise_collective(backward, "loss.backward", "S futex_do_wait", True) == "c10d allreduce (DDP backward)"
    assert recognise_collective(backward, "loss.backward", "R", True) == ""  # computing, not waiting
    assert recognise_collective(backward, "loss.backward", "S futex_do_wait", False) == ""  # no process group
    explicit = [user, Frame("<lib>/torch/distributed/c10d_logger.py", 83, "wrapper"),
                Frame("<lib>/torch/distributed/distributed_c10d.py", 3252, "all_reduce")]
    assert recognise_collective(explicit, "dist.all_reduce", "S futex_do_wait", True) == "c10d allreduce"
    assert recognise_collective([user], "work.wait", "S futex_do_wait", True) == "c10d wait (async work)"
    assert recognise_collective([user], "time.sleep", "S hrtimer_nanosleep", True) == ""


def test_snapshot_with_the_real_runtime(clean_env: dict[str, str]) -> None:
    import torch

    from perftracker.config import Config
    from perftracker.runtime import runtime as rtmod

    rt = rtmod.activate(Config.from_env(autostart_agent=False))
    try:
        w = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(3):
            w.sum().backward()
            opt.step()
            opt.zero_grad()
        result: list[HangSnapshot] = []
        t = threading.Thread(target=lambda: result.append(take_snapshot(rt, session="s")))
        t.start()
        t.join()
    finally:
        rtmod.deactivate()
    snap = result[0]
    assert snap.last_event.startswith("optimizer.step") and 0.0 <= snap.idle_s < 5.0
    assert snap.last_iteration == rt.iteration >= 1
    assert snap.pid == os.getpid() and snap.rank == rt.identity.rank and snap.job == rt.identity.job
    # the main thread was inside t.start() (waiting for the thread to run) or t.join(): its stack
    # ends in threading's wait either way, and the call in progress is the one it was in
    assert snap.stack[-1].file == "<stdlib>/threading.py"
    assert any(f.function == "test_snapshot_with_the_real_runtime" for f in snap.stack)
    assert snap.current_op in ("t.join", "t.start")


def _inner_fail() -> None:
    raise RuntimeError("Connection reset by peer\nmore text")


def _outer_fail() -> None:
    _inner_fail()


def test_exit_snapshot_from_an_exception_traceback() -> None:
    from perftracker.runtime.hang_capture import exit_snapshot

    try:
        _outer_fail()
    except RuntimeError as exc:
        snap = exit_snapshot(_runtime(FakeClock(10**9)), exc, session="s")
    assert snap is not None
    assert [f.function for f in snap.stack] == ["test_exit_snapshot_from_an_exception_traceback", "_outer_fail",
                                                "_inner_fail"]
    assert snap.error == "RuntimeError: Connection reset by peer"
    assert snap.current_op == ""  # a raise is not a call
    assert snap.rank == 2 and snap.last_iteration == 301 and snap.session == "s"
    assert exit_snapshot(_runtime(), RuntimeError("never raised")) is None  # no traceback


def test_snapshot_falls_back_to_the_exception_when_the_thread_has_no_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    # after an unhandled exception the main thread has no Python frame (or only exit handlers)
    monkeypatch.setattr("perftracker.runtime.hang_capture._training_frame", lambda tid: (None, 0))
    try:
        _outer_fail()
    except RuntimeError as exc:
        monkeypatch.setattr(sys, "last_value", exc, raising=False)
    snap = take_snapshot(_runtime(FakeClock(10**9)), session="s")
    assert snap.error == "RuntimeError: Connection reset by peer" and snap.session == "s"
    assert [f.function for f in snap.stack][-2:] == ["_outer_fail", "_inner_fail"]
    monkeypatch.setattr(sys, "last_value", None, raising=False)
    assert take_snapshot(_runtime()).stack == ()

