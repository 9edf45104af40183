"""Issue 46 (third red-team round), items 4 and 8 on a real agent process: a worker that names a
FIFO as its ``TORCHELASTIC_ERROR_FILE`` and dies does not freeze the agent (it still ACKs the next
worker and ends on SIGTERM); the pid a worker declares is replaced by the kernel's (``SO_PEERCRED``);
one process holds at most ``MAX_RANKS_PER_PROCESS`` ranks; a connection that never registers is
closed after ``REGISTER_TIMEOUT_S``. The checks themselves:
tests/component/test_hardening_third_agent.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from agent_helpers import REPO, AgentProc, WireWorker, cleanup, env_for_tests, short_run_dir
from perftracker.agent.daemon.daemon import MAX_RANKS_PER_PROCESS, REGISTER_TIMEOUT_S

from perftracker.wire import framing as wire

_DYING = r"""
import os, socket, sys
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType
s = wire.connect(wire.socket_path(sys.argv[1]), 5.0)
wire.send_message(s, wire.make_message(MessageType.REGISTER, protocol=wire.PROTOCOL_VERSION, job="jobF", rank=0,
                  world_size=2, local_rank=0, pid=int(sys.argv[2]), training_tid=1, host=socket.gethostname()))
print(wire.recv_message(s)["ok"], flush=True)
os._exit(1)
"""


def test_a_fifo_error_file_does_not_freeze_the_agent_and_the_kernel_pid_is_used(tmp_path: Path) -> None:
    run_dir = short_run_dir("fifo")
    agent = AgentProc(run_dir, tmp_path / "runs")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        agent.wait_ready()
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # connects, never registers
        idle.connect(str(wire.socket_path(run_dir)))
        t_idle = time.monotonic()
        fifo = tmp_path / "error.fifo"
        os.mkfifo(fifo)
        # a worker that names a FIFO as its error file, declares the sleep's pid, then dies (exit 1)
        dying = subprocess.run([sys.executable, "-c", _DYING, str(run_dir), str(sleeper.pid)], capture_output=True,
                               text=True, timeout=30, env=env_for_tests(TORCHELASTIC_ERROR_FILE=str(fifo)), cwd=REPO)
        assert dying.stdout.strip() == "True", dying.stderr
        deadline = time.monotonic() + 20
        while "error file" not in agent.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "not reading the worker's error file" in agent.log() and "not a regular file" in agent.log()
        assert f"declared pid {sleeper.pid} but the kernel says" in agent.log()
        w = WireWorker(run_dir, 1, 2, job="jobF")  # the agent still answers
        try:
            assert w.ack["ok"] is True
            deep = b"[" * 100_000 + b"]" * 100_000  # a frame nested 100,000 levels deep: ignored
            w.sock.sendall(len(deep).to_bytes(4, "big") + deep)
            deadline = time.monotonic() + 10
            while "ignoring a frame" not in agent.log() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "nested too deeply" in agent.log()
            w.sock.settimeout(1.0)
            try:  # still connected: nothing to read, or a message the agent sends; never EOF
                got = w.sock.recv(1)
            except TimeoutError:
                got = b"(nothing)"
            assert got != b"", agent.log()[-1500:]
            assert "worker rank 1 of job jobF disconnected" not in agent.log()
        finally:
            w.close()
        # at most MAX_RANKS_PER_PROCESS ranks from one process (this one)
        held = [WireWorker(run_dir, r, 8, job="jobR") for r in range(MAX_RANKS_PER_PROCESS + 1)]
        try:
            assert [h.ack["ok"] for h in held] == [True] * MAX_RANKS_PER_PROCESS + [False]
            assert "already holds" in held[-1].ack["error"]
        finally:
            for h in held:
                h.close()
        idle.settimeout(REGISTER_TIMEOUT_S + 10)
        assert idle.recv(1) == b""  # closed by the agent
        assert REGISTER_TIMEOUT_S - 1 <= time.monotonic() - t_idle <= REGISTER_TIMEOUT_S + 10
        idle.close()
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(20) is not None  # SIGTERM still ends it
    finally:
        sleeper.kill()
        sleeper.wait()
        agent.kill()
        cleanup(run_dir)
