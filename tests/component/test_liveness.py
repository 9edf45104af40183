"""Liveness (psutil) of real processes: alive, SIGSTOPped, zombie, dead, pid reused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from perftracker.agent.daemon.liveness import ExitWatch, ProcState, probe, started_at, state_of


def _status(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"


def _wait_status(pid: int, status: str, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if _status(pid) == status:
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} never reached status {status}: {_status(pid)}")


def test_alive_stopped_continued_zombie_dead() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = started_at(proc.pid)
        assert started > 0
        info = probe(proc.pid, started)
        assert info.state is ProcState.ALIVE and info.started == started
        os.kill(proc.pid, signal.SIGSTOP)
        _wait_status(proc.pid, psutil.STATUS_STOPPED)
        info = probe(proc.pid, started)
        assert info.state is ProcState.STOPPED and info.detail == "process stopped"
        os.kill(proc.pid, signal.SIGCONT)
        _wait_status(proc.pid, psutil.STATUS_SLEEPING)
        assert probe(proc.pid, started).state is ProcState.ALIVE
        os.kill(proc.pid, signal.SIGKILL)
        _wait_status(proc.pid, psutil.STATUS_ZOMBIE)  # not reaped yet: a zombie is dead
        info = probe(proc.pid, started)
        assert info.state is ProcState.DEAD and info.detail == "process dead" and info.status == "zombie"
    finally:
        proc.kill()
        proc.wait()
    assert probe(proc.pid, started).state is ProcState.DEAD  # reaped: no such process
    assert started_at(proc.pid) == 0.0
    assert probe(0).state is ProcState.DEAD and probe(-5).state is ProcState.DEAD


def test_pid_reuse_is_dead_and_busy_process_is_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        _wait_status(proc.pid, psutil.STATUS_RUNNING)
        started = started_at(proc.pid)
        assert probe(proc.pid).state is ProcState.ALIVE
        # the same pid with another creation time is another process
        assert probe(proc.pid, started + 0.01).state is ProcState.DEAD
    finally:
        proc.kill()
        proc.wait()


def test_odd_command_names_and_the_states_of_psutils_words(tmp_path: Path) -> None:
    # a command name with parentheses and a state letter in it (the kernel's comm is the name the
    # program was started by): its state is still read right
    odd = tmp_path / "x) Z 1 (y"
    odd.symlink_to(sys.executable)
    proc = subprocess.Popen([str(odd), "-c", "import time; time.sleep(60)"])
    try:
        assert psutil.Process(proc.pid).name().startswith("x) Z")
        started = started_at(proc.pid)
        info = probe(proc.pid, started)
        assert info.state is ProcState.ALIVE and info.started == started
    finally:
        proc.kill()
        proc.wait()
    # uninterruptible kernel waits and tracer stops cannot be made here for real
    assert state_of(psutil.STATUS_DISK_SLEEP) is ProcState.DISK_WAIT
    assert state_of(psutil.STATUS_TRACING_STOP) is ProcState.STOPPED
    assert state_of(psutil.STATUS_DEAD) is ProcState.DEAD
    assert state_of(psutil.STATUS_IDLE) is ProcState.ALIVE and state_of("no such word") is ProcState.ALIVE


def test_exit_watch_orders_deaths_of_non_children() -> None:
    # the watched processes are grandchildren (like torchrun's workers seen from the agent)
    code = ("import subprocess, sys, time\n"
            "ps = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']) for _ in range(2)]\n"
            "print(' '.join(str(p.pid) for p in ps), flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        first, second = (int(x) for x in parent.stdout.readline().split())  # type: ignore[union-attr]
        watch = ExitWatch()
        assert watch.add(first, started_at(first)) and watch.add(second, started_at(second))
        assert watch.poll(0.05) == []
        os.kill(first, signal.SIGKILL)
        time.sleep(0.05)
        os.kill(second, signal.SIGTERM)
        seen: list[tuple[int, int]] = []
        end = time.monotonic() + 5
        while len(seen) < 2 and time.monotonic() < end:
            seen += watch.poll(0.5)
        assert [pid for pid, _ in seen] == [first, second]
        assert seen[0][1] < seen[1][1]
        assert watch.exited_ns[first] == seen[0][1]
        assert watch.poll(0.01) == []  # reported once
        assert not watch.add(2**22 + 12345)  # no such process: no pidfd
        watch.close()
    finally:
        parent.kill()
        parent.wait()
