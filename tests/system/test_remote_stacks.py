"""Python stacks read from outside the training process (perftracker/remote_stacks.py, run by the
sampler process): the executions of the training loop's calls, and a fallback to the in-process
sampler (how closely the executions match the calls: tests/accuracy/test_stack_sampling.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import window_workload as ww

from perftracker import remote_stacks
from perftracker.errors import PerftrackerError
from perftracker.model.raw_window import EventKind, RawWindow
from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult

pytestmark = pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="remote stacks are built for CPython 3.11")


def test_reads_another_process_stack(tmp_path: Path) -> None:
    """A real second process: calibrate there, read its stack from here, by name and line."""
    script = tmp_path / "target.py"
    script.write_text(encoding="utf-8", data=textwrap.dedent("""
        import sys, time
        from perftracker.remote_stacks import calibrate
        def leaf_\xe9():
            while True:
                time.sleep(0.001)
        def middle():
            leaf_\xe9()
        print(calibrate().to_json(), flush=True)
        middle()
    """))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PERFTRACKER_DISABLE="1")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        layout = remote_stacks.StackLayout.from_json(proc.stdout.readline())
        reader = remote_stacks.RemoteStackReader(proc.pid, layout)
        stack = None
        for _ in range(200):
            stack = reader.sample()
            if stack and stack[0][1].co_name == "leaf_\xe9":
                break
            time.sleep(0.01)
        assert stack is not None
        got = [(c.co_name, c.co_firstlineno, c.co_filename) for _, c in stack]
        assert got == [("leaf_\xe9", 4, str(script)), ("middle", 7, str(script)), ("<module>", 1, str(script))]
        t, samples = [1, 2], [stack, stack[1:]]
        remote_stacks.save_samples(str(tmp_path / "s.npz"), t, samples)
        t2, back = remote_stacks.load_samples(tmp_path / "s.npz")
        assert t2 == t and [[(f, c.co_name) for f, c in s] for s in back] == [[(f, c.co_name) for f, c in s]
                                                                            for s in samples]
        assert back[0][1][1] is back[1][0][1]  # one object per code, compared with `is` downstream
    finally:
        proc.kill()
        proc.wait()
    assert reader.sample() is None  # the process is gone: no stack, no exception


@pytest.mark.timeout(120)
def test_remote_stacks_give_the_executions(tmp_path: Path) -> None:
    """(one execution per call, and each function's share of the window:
    tests/accuracy/test_stack_sampling.py)"""
    raw, _ = ww.remote_stacks_window(tmp_path)
    names = raw.names
    for func in ("outer", "inner", "other"):
        assert ww.executions(raw, func).any(), func  # each function was sampled
    for r in np.nonzero(ww.executions(raw, "inner"))[0]:
        p = raw.col("parent")[r]
        assert p >= 0 and names[raw.col("name_id")[p]].endswith(": outer")
    assert not (tmp_path / "r-rank3.pystacks.npz").exists()  # consumed into the raw file


@pytest.mark.timeout(120)
def test_no_calibration_falls_back_to_the_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    def refuse() -> remote_stacks.StackLayout:
        raise PerftrackerError("remote stacks: not built for this interpreter")

    monkeypatch.setattr(remote_stacks, "calibrate", refuse)
    with caplog.at_level(logging.WARNING, logger="perftracker.runtime.window.profile"):
        raw, _ = ww.remote_stacks_window(tmp_path, fallback=True)
    assert "sampling Python stacks in a thread instead" in caplog.text
    assert (raw.col("kind") == EventKind.PYTHON).sum() > 0  # the thread sampled them


@pytest.mark.timeout(120)
def test_a_dead_sampler_costs_the_stacks_not_the_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The sampler process dies mid-window: the window is still written (ops, GC), without Python
    rows, with a warning; nothing raises."""
    monkeypatch.setattr("perftracker.runtime.window.writer.REMOTE_STACKS_WAIT_S", 1.0)
    # the thread writer: a conversion child (the default) logs its warning in the child, out of caplog's reach
    win = ProfileWindow(ww.Ident(), tmp_path, options=WindowOptions(stacks="remote", spawn_sampler=True,
                                                                    writer="thread"))
    done: list[WindowResult] = []
    assert win.arm("dead", 1.0, done.append)
    killed: list[int] = []

    def body() -> None:
        ww.outer()
        ww.other()
        cur = win._cur
        if win.state == "active" and not killed and cur is not None and cur.sampler is not None:
            killed.append(cur.sampler.proc.pid)
            cur.sampler.proc.kill()

    with caplog.at_level(logging.WARNING, logger="perftracker.runtime.window.profile"):
        ww.drive(win, done, body=body)
    res = done[0]
    assert killed and res.error == "" and res.raw_path is not None
    raw = RawWindow.load(res.raw_path)
    kinds = raw.col("kind")
    assert (kinds == EventKind.PYTHON).sum() == 0 and (kinds == EventKind.CPU_OP).sum() > 0
    assert "no Python stacks from the sampler process" in caplog.text


def test_a_read_keeps_the_gil() -> None:
    """The in-process sampler thread reads the training thread's stack with several reads per sample.
    If a read released the GIL, each would have to win it back from a training thread running Python
    (up to a switch interval each): on an idle 2-core host that halved the samples and left gaps of
    18-31 ms, which hid whole 10 ms calls (docs/profile-window.md). A thread waiting for the GIL must
    not run while this thread reads; with no forced switch (a switch interval of 1000 s) only a
    released GIL lets it in."""
    mem = remote_stacks.Memory(os.getpid())
    buf = bytearray(b"x" * 64)
    addr = id(buf)  # a readable address of this process
    assert mem.read(addr, 16) is not None
    go = threading.Event()
    ran: list[int] = []

    def waiter() -> None:
        go.wait()  # wakes when set, then needs the GIL, which this thread holds
        ran.append(1)

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        go.set()
        for _ in range(2000):
            mem.read(addr, 16)
        during = list(ran)
    finally:
        sys.setswitchinterval(old)
    t.join(5)
    assert ran == [1]  # it did run, once this thread let the GIL go (the join)
    assert during == [], "a stack read released the GIL"
