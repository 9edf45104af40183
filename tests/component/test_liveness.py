"""Liveness from procfs on real processes: alive, SIGSTOPped, zombie, dead, pid reused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from perftracker.agent.daemon.liveness import ExitWatch, ProcState, probe, read_stat, start_ticks_of


def _wait_state(pid: int, letter: str, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        st = read_stat(pid)
        if st is not None and st[0] == letter:
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} never reached state {letter}: {read_stat(pid)}")


def test_alive_stopped_continued_zombie_dead() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = start_ticks_of(proc.pid)
        assert ticks > 0
        info = probe(proc.pid, ticks)
        assert info.state is ProcState.ALIVE and info.start_ticks == ticks
        os.kill(proc.pid, signal.SIGSTOP)
        _wait_state(proc.pid, "T")
        info = probe(proc.pid, ticks)
        assert info.state is ProcState.STOPPED and info.detail == "process stopped"
        os.kill(proc.pid, signal.SIGCONT)
        _wait_state(proc.pid, "S")
        assert probe(proc.pid, ticks).state is ProcState.ALIVE
        os.kill(proc.pid, signal.SIGKILL)
        _wait_state(proc.pid, "Z")  # not reaped yet: a zombie is dead
        info = probe(proc.pid, ticks)
        assert info.state is ProcState.DEAD and info.detail == "process dead"
    finally:
        proc.kill()
        proc.wait()
    assert probe(proc.pid, ticks).state is ProcState.DEAD  # reaped: no /proc entry
    assert probe(0).state is ProcState.DEAD and probe(-5).state is ProcState.DEAD


def test_pid_reuse_is_dead_and_busy_process_is_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        _wait_state(proc.pid, "R")
        ticks = start_ticks_of(proc.pid)
        assert probe(proc.pid).state is ProcState.ALIVE
        # the same pid with another start time is another process
        assert probe(proc.pid, ticks + 1).state is ProcState.DEAD
    finally:
        proc.kill()
        proc.wait()


def test_stat_parsing_survives_odd_command_names_and_disk_wait(tmp_path: Path) -> None:
    d = tmp_path / "4242"
    d.mkdir()
    fields = ["D"] + ["0"] * 18 + ["777"] + ["0"] * 30  # field 3 = state, field 22 = start time
    (d / "stat").write_text("4242 (evil) (name) " + " ".join(fields) + "\n")
    assert read_stat(4242, str(tmp_path)) == ("D", 777)
    info = probe(4242, 777, proc_root=str(tmp_path))
    assert info.state is ProcState.DISK_WAIT
    (d / "stat").write_text("garbage")
    assert probe(4242, proc_root=str(tmp_path)).state is ProcState.DEAD


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
        assert watch.add(first, start_ticks_of(first)) and watch.add(second, start_ticks_of(second))
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
