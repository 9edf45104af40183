"""At interpreter exit a window being written is handed to a child process that outlives the trainer
(issue 30, Deliver 4): the exit hook waits for the hand-over only, the result names the child, and
the agent waits for the child's file (agent/daemon/handed_window.py). A child that fails or dies
is reported, never waited for without bound."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from perftracker.agent.daemon.handed_window import wait_for_file
from perftracker.agent.daemon.helper_processes import ProcessingError
from window_workload import Ident, drive, other

from perftracker.model.raw_window import RawWindow
from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult


def _wait_exit(pid: int, timeout_s: float = 90.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} still running after {timeout_s} s")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("writer", ["thread", "fork"])
def test_exit_hands_a_window_being_written_to_a_child(tmp_path: Path, writer: str) -> None:
    """The writer waits at its gate until the exit path runs (a window still being written when
    training ends); finish_at_exit then returns at once with the child's pid, and the child writes
    the whole window afterwards."""
    win: ProfileWindow
    held: list[int] = []

    def gate(hurried: threading.Event) -> None:
        held.append(win.writer.child_pid)
        hurried.wait(60)  # until the exit path runs

    win = ProfileWindow(Ident(), tmp_path, options=WindowOptions(writer=writer, writer_gate=gate, exit_wait_s=30.0))
    done: list[WindowResult] = []
    assert win.arm("h", 0.5, done.append)
    deadline = time.monotonic() + 60
    it = 0
    while win.state != "finishing" and time.monotonic() < deadline:
        it += 1
        other()
        win.on_boundary(time.monotonic_ns(), it)
    assert win.state == "finishing"
    t0 = time.monotonic()
    win.finish_at_exit(win.options.exit_wait_s)
    handover_s = time.monotonic() - t0
    assert len(done) == 1 and win.state == "idle", done
    res = done[0]
    assert res.error == "" and res.writer_pid > 0 and res.writer_pid != os.getpid(), res
    if writer == "fork":  # the conversion child already running is the one that finishes
        assert held and res.writer_pid == held[0]
    assert _wait_exit(res.writer_pid) == 0
    assert res.raw_path is not None and res.raw_path.exists()
    raw = RawWindow.load(res.raw_path)
    assert len(raw) > 0 and raw.meta.window_end_ns == res.end_ns and raw.meta.session == "h"
    assert not res.raw_path.with_name(res.raw_path.name + ".error").exists()
    print(f"hand-over at exit took {handover_s:.3f} s ({writer})")


def test_without_handoff_the_exit_writes_the_window_itself(tmp_path: Path) -> None:
    win = ProfileWindow(Ident(), tmp_path, options=WindowOptions(exit_handoff=False, exit_wait_s=60.0,
                                                                 writer_gate=lambda hurried: hurried.wait(60)))
    done: list[WindowResult] = []
    assert win.arm("n", 0.3, done.append)
    it = 0
    while win.state != "finishing" and it < 10_000:
        other()
        it += 1
        win.on_boundary(time.monotonic_ns(), it)
    win.finish_at_exit(win.options.exit_wait_s)
    assert len(done) == 1 and done[0].error == "" and done[0].writer_pid == 0
    assert done[0].raw_path is not None and done[0].raw_path.exists()


def test_a_window_not_at_exit_is_never_handed_over(tmp_path: Path) -> None:
    """The twin: outside exit the writer delivers a written file and no pid."""
    win = ProfileWindow(Ident(), tmp_path, options=WindowOptions(writer="fork"))
    done: list[WindowResult] = []
    assert win.arm("w", 0.3, done.append)
    drive(win, done)
    assert done[0].error == "" and done[0].writer_pid == 0 and done[0].raw_path.exists()


# ---------------------------------------------------------------- the agent's side
def _child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_agent_waits_for_the_childs_file(tmp_path: Path) -> None:
    raw = tmp_path / "s-rank0.raw.npz"
    proc = _child(f"import time, os; time.sleep(0.5); open({str(raw) + '.tmp'!r}, 'w').write('x'); "
                  f"os.replace({str(raw) + '.tmp'!r}, {str(raw)!r})")
    waited_s = asyncio.run(wait_for_file(raw, proc.pid, timeout_s=60))
    proc.wait()
    assert raw.exists() and waited_s > 0.2


def test_agent_reports_a_child_that_failed_with_its_line(tmp_path: Path) -> None:
    raw = tmp_path / "s-rank0.raw.npz"
    proc = _child(f"import time; time.sleep(0.3); open({str(raw) + '.error'!r}, 'w').write('MemoryError: out')")
    with pytest.raises(ProcessingError, match="MemoryError: out"):
        asyncio.run(wait_for_file(raw, proc.pid, timeout_s=60))
    proc.wait()


def test_agent_reports_a_child_that_died_without_a_file(tmp_path: Path) -> None:
    raw = tmp_path / "s-rank0.raw.npz"
    proc = _child("import time; time.sleep(0.3)")
    threading.Thread(target=proc.wait, daemon=True).start()  # reaped as init would reap it
    with pytest.raises(ProcessingError, match="ended without it"):
        asyncio.run(wait_for_file(raw, proc.pid, timeout_s=60))


def test_agent_gives_up_on_a_stuck_child_after_the_timeout(tmp_path: Path) -> None:
    raw = tmp_path / "s-rank0.raw.npz"
    proc = _child("import time; time.sleep(30)")
    try:
        with pytest.raises(ProcessingError, match="not written within"):
            asyncio.run(wait_for_file(raw, proc.pid, timeout_s=0.5))
    finally:
        proc.kill()
        proc.wait()
