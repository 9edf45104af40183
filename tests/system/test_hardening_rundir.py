"""Issue 17, items 1, 10 and 12: the run dir on a shared host, the agent's trust in its workers and
in session ids, and the socket for a trainer of another uid.

The cross-uid cases need root (to own files as another uid, or to run a process as uid 10001);
they are skipped elsewhere. The checks that need no process: tests/unit/test_hardening_rundir_checks.py.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_helpers import AgentProc, WireWorker, cleanup, env_for_tests, short_run_dir, wait_until

from perftracker.rundir import (
    RunDirError,
    UnsafeSocketError,
    check_agent_socket,
    ensure_private_dir,
)
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType

OTHER_UID = 10001
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")


@pytest.fixture
def run_dir():
    d = short_run_dir("hr")
    yield d
    cleanup(d)


@root_only
def test_a_run_dir_owned_by_another_user_is_refused_by_the_agent(run_dir: Path, tmp_path: Path) -> None:
    planted = run_dir / "planted"
    planted.mkdir(mode=0o700)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(RunDirError, match=f"owned by uid {OTHER_UID}"):
        ensure_private_dir(planted)
    agent = AgentProc(planted, tmp_path / "runs")
    try:
        assert agent.proc.wait(30) != 0
        assert f"owned by uid {OTHER_UID}" in agent.log()
        assert not (planted / "agent.sock").exists()
    finally:
        agent.kill()


def test_the_agent_writes_its_files_0600_in_0700_dirs(run_dir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (run_dir / "agent.json").symlink_to(victim)  # planted before the agent starts
    agent = AgentProc(run_dir, tmp_path / "runs")
    try:
        agent.wait_ready()
        assert victim.read_text() == "precious"
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(run_dir / "windows").st_mode) == 0o700
        assert stat.S_IMODE(os.lstat(run_dir / "agent.json").st_mode) == 0o600
        assert stat.S_IMODE(os.lstat(run_dir / "agent.sock").st_mode) == 0o600
        runs = tmp_path / "runs"
        wait_until(lambda: (runs / "localizer.sqlite").exists(), 10, what="the store")
        for name in ("localizer.sqlite", "token", "localizer.json"):
            assert stat.S_IMODE(os.stat(runs / name).st_mode) == 0o600, name
        assert stat.S_IMODE(os.stat(runs).st_mode) == 0o700
    finally:
        agent.kill()


@root_only
def test_a_worker_does_not_talk_to_a_socket_another_user_planted(tmp_path: Path) -> None:
    d = tmp_path / "rd"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    path = str(d / "agent.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    try:
        with pytest.raises(UnsafeSocketError, match="writable by group or others"):
            wire.connect(path, 1.0)
        os.chmod(d, 0o755)
        os.chown(path, OTHER_UID, OTHER_UID)
        with pytest.raises(UnsafeSocketError, match=f"owned by uid {OTHER_UID}"):
            check_agent_socket(path)
        os.chown(path, os.geteuid(), os.getegid())
        wire.connect(path, 1.0).close()  # ours again: connects
    finally:
        srv.close()


def test_a_bad_worker_message_is_ignored_and_the_connection_lives(run_dir: Path, tmp_path: Path) -> None:
    agent = AgentProc(run_dir, tmp_path / "runs", "--poll-timeout-s", "5", "--keep-files")
    try:
        agent.wait_ready()
        precious = tmp_path / "precious.npz"
        precious.write_text("keep")
        w = WireWorker(run_dir, 0, 1, job="jobV")
        up = agent.uplink()
        wait_until(lambda: "jobV" in up.jobs(), 10, what="registration")
        w.send(MessageType.HEARTBEAT, iteration=7, phase="x" * 800)  # too long: ignored
        w.send(MessageType.ITER_STATS, iteration=7, recent_ms=[1.0], mean_ms="fast")  # wrong type: ignored
        w.send(MessageType.WINDOW_DONE, session="nosuch", raw_path=str(precious), start_ns=1, end_ns=2, error="")
        w.send(MessageType.HEARTBEAT, iteration=9, phase="watching")  # the connection still works
        session, _ = up.create_trigger("jobV", "t", 1.0)
        msg = w.recv(20)
        while msg["type"] != "start_window":
            msg = w.recv(20)
        assert msg["session"] == session
        time.sleep(0.5)
        assert precious.read_text() == "keep"
        log = agent.log()
        assert "ignoring a heartbeat message of rank 0" in log and "ignoring a iter_stats message" in log
        assert "Traceback" not in log
    finally:
        w.close()
        agent.kill()


# ---------------------------------------------------------------- item 12: the socket for another uid
_CONNECT = """
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(json.dumps({"error": exc.strerror})); sys.exit(0)
body = json.dumps({"type": "register", "protocol": 1, "job": "jobG", "rank": 0, "world_size": 1, "local_rank": 0,
                   "pid": 1, "training_tid": 1, "host": "h"}).encode()
s.sendall(struct.pack(">I", len(body)) + body)
n = struct.unpack(">I", s.recv(4))[0]
print(s.recv(n).decode())
"""


def _system_python() -> str:
    """A Python that uid 10001 may run (the suite's may live under a private home directory)."""
    for exe in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        if os.path.exists(exe) and os.stat(exe).st_mode & stat.S_IXOTH:
            return exe
    pytest.skip("no Python executable for other users")


def _connect_as(uid: int, path: Path) -> dict:
    out = subprocess.run([_system_python(), "-I", "-c", _CONNECT, str(path)], user=uid, group=uid, extra_groups=[],
                         capture_output=True, text=True, timeout=30, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@root_only
def test_socket_group_lets_a_trainer_of_another_uid_connect(tmp_path: Path) -> None:
    base = short_run_dir("sg")
    os.chmod(base, 0o755)
    try:
        plain = base / "plain"
        agent = AgentProc(plain, tmp_path / "runs1", env=env_for_tests())
        try:
            agent.wait_ready()
            os.chmod(plain, 0o711)  # even with the directory traversable, the 0600 socket refuses uid 10001
            assert _connect_as(OTHER_UID, plain / "agent.sock") == {"error": "Permission denied"}
        finally:
            agent.kill()
        grouped = base / "grouped"
        agent = AgentProc(grouped, tmp_path / "runs2", "--socket-group", str(OTHER_UID))
        try:
            agent.wait_ready()
            sock = os.lstat(grouped / "agent.sock")
            assert (stat.S_IMODE(sock.st_mode), sock.st_gid) == (0o660, OTHER_UID)
            d = os.stat(grouped)
            assert (stat.S_IMODE(d.st_mode), d.st_gid) == (0o750, OTHER_UID)
            win = os.stat(grouped / "windows")
            assert (stat.S_IMODE(win.st_mode), win.st_gid) == (0o2770, OTHER_UID)
            ack = _connect_as(OTHER_UID, grouped / "agent.sock")
            assert ack["type"] == "ack" and ack["ok"] is True
        finally:
            agent.kill()
    finally:
        cleanup(base)


def test_frame_header_is_big_endian_length() -> None:  # the _CONNECT helper speaks the wire by hand
    assert wire.encode({"a": 1})[:4] == struct.pack(">I", len(b'{"a":1}'))

