"""ProfileWindow: boundaries, refusal of a second trigger, profiler failure, cleanup, NVTX, stacks.

The training loop and its ground truth: tests/window_workload.py; how closely the sampled Python
executions match the calls: tests/accuracy/test_stack_sampling.py."""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from window_workload import (
    Ident,
    drive,
    executions,
    no_profiler_state,
    outer,
    spin,
    window_with_stacks,
)

from perftracker.model.raw_window import EventKind, RawWindow
from perftracker.runtime.window import local as window_local
from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult


@pytest.mark.parametrize("reader", [True, False], ids=["memory_reader", "frame_objects"])
def test_window_rows_stacks_and_cleanup(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch, reader: bool) -> None:
    """Both ways of sampling the stack in a thread: by default on CPython 3.11 the sampler reads
    the stack's memory and never asks for the training thread's frame objects (walking those from
    another thread is what crashes 3.11 now and then); elsewhere, or with stack_reader=False, it
    walks them."""
    switch, ncb = sys.getswitchinterval(), len(gc.callbacks)
    win, done, frames_asked = window_with_stacks(tmp_path, caplog, monkeypatch, reader)
    uses_memory = reader and sys.version_info[:2] == (3, 11)
    assert bool(frames_asked) != uses_memory, len(frames_asked)
    res = done[0]
    assert res.error == "" and res.session == "s1" and res.raw_path is not None
    assert res.end_ns - res.start_ns >= 1.5e9
    no_profiler_state(switch, ncb)
    raw = RawWindow.load(res.raw_path)
    m = raw.meta
    assert (m.rank, m.world_size, m.local_rank, m.host, m.pid, m.training_tid) == (3, 4, 1, "h", os.getpid(), Ident.training_tid)
    assert (m.window_start_ns, m.window_end_ns) == (res.start_ns, res.end_ns)
    assert len(m.iteration_ms) == res.iterations >= 5
    # it stopped at the FIRST boundary after window_s: the one before was still inside
    assert res.end_ns - res.start_ns - m.iteration_ms[-1] * 1e6 < 1.5e9 + 1e6
    kinds = raw.col("kind")
    assert {EventKind.PYTHON, EventKind.CPU_OP, EventKind.GC} <= set(kinds.tolist())
    assert raw.col("start_ns").min() >= m.window_start_ns and raw.col("end_ns").max() <= m.window_end_ns
    ops = kinds == EventKind.CPU_OP
    assert set(raw.col("tid")[ops].tolist()) == {m.training_tid}  # ops on the training thread
    mm = [i for i, n in enumerate(raw.names) if n == "aten::mm"]
    assert np.isin(raw.col("name_id")[ops], mm).sum() >= res.iterations
    # aten::mm nests in aten::matmul
    parents = raw.col("parent")[ops & np.isin(raw.col("name_id"), mm)]
    assert all(raw.names[raw.col("name_id")[p]] == "aten::matmul" for p in parents if p >= 0)

    # parent links and stacks: every inner() execution sits in an outer() execution
    names = raw.names
    for func in ("outer", "inner", "other"):
        assert executions(raw, func).any(), func  # each function was sampled
    rows = np.nonzero(executions(raw, "inner"))[0]
    for r in rows:
        p = raw.col("parent")[r]
        assert p >= 0 and names[raw.col("name_id")[p]].endswith(": outer")
        assert raw.col("start_ns")[p] <= raw.col("start_ns")[r] and raw.col("end_ns")[r] <= raw.col("end_ns")[p]
        stack = raw.stacks[raw.col("stack_id")[r]]
        assert [names[i].rsplit(": ", 1)[1] for i in stack[-2:]] == ["outer", "inner"]
    gc_rows = kinds == EventKind.GC
    assert gc_rows.sum() >= 1 and set(raw.col("tid")[gc_rows].tolist()) == {m.training_tid}
    # a later window works again: nothing left armed
    assert win.arm("s4", 0.2, done.append)
    drive(win, done)
    assert len(done) == 2 and done[1].error == ""
    no_profiler_state(switch, ncb)


def test_profiler_failure_keeps_training(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    switch, ncb = sys.getswitchinterval(), len(gc.callbacks)
    win = ProfileWindow(Ident(), tmp_path)
    done: list[WindowResult] = []
    with torch.profiler.profile() as other_prof:  # another profiler is already active
        assert win.arm("busy", 0.5, done.append)
        with caplog.at_level(logging.WARNING, logger="perftracker.runtime.window.profile"):
            iterations = 0
            for i in range(5):
                outer()
                win.on_boundary(time.monotonic_ns(), i)
                iterations += 1
            win.wait(5)
        assert iterations == 5  # training went on
        assert torch.autograd.profiler._is_profiler_enabled  # theirs untouched
    assert other_prof.events() is not None
    assert len(done) == 1 and done[0].raw_path is None
    assert "another profiler" in done[0].error
    assert "profiling skipped, training continues" in caplog.text and "another profiler" in caplog.text
    no_profiler_state(switch, ncb)
    assert win.arm("again", 0.2, done.append)  # and the window is usable afterwards
    drive(win, done)
    assert done[-1].error == ""


def test_write_failure_is_reported_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    win = ProfileWindow(Ident(), blocker / "sub", options=WindowOptions(writer="thread"))
    done: list[WindowResult] = []
    assert win.arm("w", 0.2, done.append)
    drive(win, done)
    assert done and done[0].error and done[0].raw_path is None
    assert not torch._C._autograd._profiler_enabled()


def test_nvtx_ranges_wrap_window_and_iterations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nvtx

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(nvtx, "start_range", lambda message=None, domain=None, **k: calls.append(("start", message)) or 7)
    monkeypatch.setattr(nvtx, "end_range", lambda rid: calls.append(("end", str(rid))))
    monkeypatch.setattr(nvtx, "push_range", lambda message=None, domain=None, **k: calls.append(("push", message)))
    monkeypatch.setattr(nvtx, "pop_range", lambda domain=None: calls.append(("pop", "")))
    win = ProfileWindow(Ident(), tmp_path)
    done: list[WindowResult] = []
    assert win.arm("nv", 0.3, done.append)
    drive(win, done)
    assert calls[0] == ("start", "perftracker window nv") and calls[-1] == ("end", "7")
    pushes = [c for c in calls if c[0] == "push"]
    assert len(pushes) == len([c for c in calls if c[0] == "pop"]) == done[0].iterations
    assert pushes[1][1].startswith("perftracker iteration ")


def test_a_window_without_nvtx_runs_without_its_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """nvtx missing (a GPU image installed with --no-deps, seen on the H200 device check): the window
    still records and is written, with one warning; before, every window failed at its start."""
    from perftracker.runtime.window import instruments as window_instruments

    monkeypatch.setitem(sys.modules, "nvtx", None)  # import nvtx -> ImportError
    monkeypatch.setattr(window_instruments, "_NVTX_MISSING", [])
    done: list[WindowResult] = []
    for session in ("nv1", "nv2"):
        win = ProfileWindow(Ident(), tmp_path, options=WindowOptions(nvtx=True, writer="thread"))
        assert win.arm(session, 0.3, done.append)
        drive(win, done)
    assert [d.error for d in done] == ["", ""] and all(d.raw_path is not None and d.iterations > 0 for d in done)
    warned = [r for r in caplog.records if "no NVTX ranges" in r.getMessage()]
    assert len(warned) == 1 and "nvtx" in warned[0].getMessage()


def test_runtime_boundaries_drive_the_window(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """Hooked to the real Runtime: DataLoader + optimizer.step boundaries open and close it."""
    from perftracker.config import Config
    from perftracker.runtime import runtime as rt_mod

    rt = rt_mod.activate(Config.from_env(autostart_agent=False))
    try:
        win = ProfileWindow(rt.identity, tmp_path)
        done: list[WindowResult] = []
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4096, 8)), batch_size=8)
        armed = False
        for i, (x,) in enumerate(data):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            spin(5)
            if i == 3:
                armed = win.arm("rt", 0.3, done.append)
            if done:
                break
        assert armed and done and done[0].error == "", done
        assert done[0].iterations >= 3  # several boundaries drove it (fewer fit in 0.3 s on a loaded node)
        assert RawWindow.load(done[0].raw_path).meta.training_tid == rt.identity.training_tid
    finally:
        rt_mod.deactivate()


def _train_until_local_window(rt: Any, out_dir: Path) -> WindowResult:
    """Train on the real runtime with a LocalWindowSink, trigger at iteration 3, return the first result."""
    sink = window_local.LocalWindowSink(rt, out_dir, window_s=0.5)
    rt.set_sink(sink)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + 40
    triggered = False
    while not sink.results and time.monotonic() < deadline:
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        spin(5)
        if not triggered and rt.iteration >= 3:
            triggered = rt.trigger("manual")
    assert sink.results, "no window result"
    return sink.results[0]


def test_local_window_sink_spawns_sampler(tmp_path: Path, clean_env: dict[str, str]) -> None:
    from perftracker.config import Config
    from perftracker.model.raw_window import SampleSet
    from perftracker.runtime import runtime as rt_mod

    rt = rt_mod.activate(Config.from_env(autostart_agent=False))
    try:
        res = _train_until_local_window(rt, tmp_path)
        assert res.error == "" and res.samples_path is not None
        cpu = SampleSet.load(res.samples_path).get("cpu")
        assert cpu is not None and cpu.t_ns[0] <= res.start_ns and cpu.t_ns[-1] >= res.end_ns
    finally:
        rt_mod.deactivate()


@pytest.mark.parametrize("stacks", ["sample", "remote", "off"])
def test_window_stacks_setting_reaches_the_window(tmp_path: Path, clean_env: dict[str, str], stacks: str) -> None:
    """PERFTRACKER_WINDOW_STACKS=off: the window records no Python frames (no sampler thread)."""
    from perftracker.config import Config
    from perftracker.model.raw_window import EventKind
    from perftracker.runtime import runtime as rt_mod

    rt = rt_mod.activate(Config.from_env({"PERFTRACKER_WINDOW_STACKS": stacks}, autostart_agent=False))
    try:
        res = _train_until_local_window(rt, tmp_path)
        assert res.error == "", res
        raw = RawWindow.load(res.raw_path)
        n_python = int((raw.col("kind") == EventKind.PYTHON).sum())
        assert (n_python > 0) == (stacks != "off"), n_python
    finally:
        rt_mod.deactivate()

