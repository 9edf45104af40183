"""Issue 17, items 1 and 10, without a process: the run dir is created private and an open one is
refused, private files never write through a planted symlink, worker messages are checked for
lengths and types, and session ids and worker paths stay inside the agent's directories (the agent
and its socket for real: tests/system/test_hardening_rundir.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from perftracker.agent.daemon.window_session import WindowOptions, WindowRunner, session_dir_name
from perftracker.agent.daemon.workers import BadWorkerMessage, check_worker_message

from perftracker.rundir import (
    RunDirError,
    ensure_private_dir,
    write_private,
)


# ---------------------------------------------------------------- item 1: the run dir
def test_private_dir_is_created_0700_and_an_open_one_is_refused(tmp_path: Path) -> None:
    d = ensure_private_dir(tmp_path / "rd")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    ensure_private_dir(d)  # ours and closed: accepted again
    os.chmod(d, 0o755)  # ours, readable by others: tightened, not refused
    ensure_private_dir(d)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    for mode in (0o777, 0o770, 0o702):
        os.chmod(d, mode)
        with pytest.raises(RunDirError, match="writable by group or others"):
            ensure_private_dir(d)
    os.chmod(d, 0o700)
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(RunDirError, match="symlink"):
        ensure_private_dir(link)


def test_write_private_replaces_a_planted_symlink_and_never_writes_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.chmod(victim, 0o600)
    d = ensure_private_dir(tmp_path / "rd")
    (d / "agent.json").symlink_to(victim)
    write_private(d / "agent.json", '{"pid": 1}')
    assert victim.read_text() == "precious"
    st = os.lstat(d / "agent.json")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]


# ---------------------------------------------------------------- item 10: worker messages
def test_worker_messages_are_checked_for_lengths_and_types() -> None:
    ok = {"type": "heartbeat", "iteration": 3, "phase": "watching"}
    check_worker_message(ok)
    for bad in ({**ok, "phase": "x" * 800}, {**ok, "idle_s": "soon"}, {**ok, "idle_s": float("inf")},
                {**ok, "phase": "a\ud800"}, {**ok, "iteration": -5}):
        with pytest.raises(BadWorkerMessage):
            check_worker_message(bad)
    reg = {"type": "register", "protocol": 1, "job": "j", "rank": 0, "world_size": 2, "local_rank": 0, "pid": 5,
           "training_tid": 5, "host": "h"}
    check_worker_message(reg)
    for bad in ({**reg, "rank": 2}, {**reg, "job": "a b"}, {**reg, "host": "h" * 300}, {**reg, "pid": 0}):
        with pytest.raises(BadWorkerMessage):
            check_worker_message(bad)
    done = {"type": "window_done", "session": "s1", "raw_path": "/x", "start_ns": 0, "end_ns": 1, "error": ""}
    check_worker_message(done)
    for bad in ({**done, "session": "../../etc"}, {**done, "session": ".hidden"}, {**done, "start_ns": -1}):
        with pytest.raises(BadWorkerMessage):
            check_worker_message(bad)


def test_session_ids_and_worker_paths_stay_inside_the_agents_directories(tmp_path: Path) -> None:
    assert session_dir_name("20260101-000000-abc123") == "20260101-000000-abc123"
    from perftracker.agent.daemon.helper_processes import ProcessingError

    for bad in ("../x", "a/b", "..", ".", "", "x" * 300):
        with pytest.raises(ProcessingError):
            session_dir_name(bad)
    runner = WindowRunner(str(tmp_path), WindowOptions(samplers=False, summarize_worker=False), None, None)  # type: ignore[arg-type]
    (tmp_path / "windows").mkdir()
    inside = tmp_path / "windows" / "s-rank0.npz"
    inside.write_bytes(b"x")
    assert runner.worker_file(str(inside), "raw_path") == inside.resolve()
    outside = tmp_path / "precious"
    outside.write_text("keep")
    link = tmp_path / "windows" / "link.npz"
    link.symlink_to(outside)
    for bad in (str(outside), str(tmp_path / "windows" / ".." / "precious"), str(link), "", "/etc/passwd"):
        with pytest.raises(ProcessingError):
            runner.worker_file(bad, "raw_path")
