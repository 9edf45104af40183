"""The node agent's side of one localizer per job across nodes (issue 42), with a real agent process:
a job that spans nodes is held until a rank names its localizer; an agent of a shared localizer
offers nothing and holds nothing."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from perftracker.agent.daemon.localizer_client import Uplink
from perftracker.localizer.service.embedded import job_records, start_embedded

from perftracker.runtime.job_link import FEATURE
from perftracker.wire.framing import MessageType


def _register(run_dir: Path, job: str, rank: int, world: int, pending: bool) -> tuple[socket.socket, dict[str, Any]]:
    import os
    import threading

    from perftracker.wire import framing as wire

    sock = wire.connect(wire.socket_path(run_dir), 5.0)
    extra = {"job_link": "pending"} if pending else {}
    wire.send_message(sock, wire.make_message(
        MessageType.REGISTER, protocol=wire.PROTOCOL_VERSION, job=job, rank=rank, world_size=world, local_rank=0,
        pid=os.getpid(), training_tid=threading.get_native_id(), host=socket.gethostname(), **extra))
    return sock, wire.recv_message(sock)


def test_the_agent_holds_a_multinode_job_until_a_rank_names_its_localizer(tmp_path: Path) -> None:
    """A real agent: a job that spans nodes is registered nowhere until JOB_ROUTE names its localizer
    (on "node 0", another embedded localizer here), then there and not with the agent's own."""
    import time

    from tests.agent_helpers import AgentProc, short_run_dir

    node0 = start_embedded(tmp_path / "node0")
    agent = AgentProc(short_run_dir("jl"), tmp_path / "node1")
    try:
        agent.wait_ready()
        sock, ack = _register(agent.run_dir, "mj", 2, 4, pending=True)
        assert FEATURE in ack.get("features", [])
        time.sleep(2.0)  # past the agent's registration debounce: still held
        own = agent.uplink()
        assert "mj" not in own.jobs()
        token = "route-token-" + "p4q5r6" * 4
        url = node0.serve_job("mj", "127.0.0.5", 0, token)
        from perftracker.wire import framing as wire

        wire.send_message(sock, wire.make_message(MessageType.JOB_ROUTE, job="mj", url=url, token=token,
                                                  served_by="node0-1"))
        deadline = time.monotonic() + 15
        while "mj" not in Uplink(node0.url, node0.token).jobs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert Uplink(node0.url, node0.token).jobs() == ["mj"], agent.log()
        assert "mj" not in own.jobs()
        rec = [r for r in job_records(tmp_path / "node1") if r["job"] == "mj"]
        assert rec and rec[0]["url"] == url and rec[0]["token"] == token  # for `perftracker report` there
        # a job on one node (no job_link) registers with the agent's own localizer at once
        sock2, _ = _register(agent.run_dir, "solo", 0, 1, pending=False)
        deadline = time.monotonic() + 15
        while "solo" not in own.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "solo" in own.jobs()
        sock.close()
        sock2.close()
    finally:
        agent.kill()
        node0.stop()


def test_an_agent_of_a_shared_localizer_offers_no_job_link_and_holds_nothing(tmp_path: Path) -> None:
    import time

    from tests.agent_helpers import env_for_tests, short_run_dir

    shared = start_embedded(tmp_path / "shared")
    run_dir = short_run_dir("jls")
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "perftracker", "agent", "--run-dir", str(run_dir), "--url",
                             shared.url], env=env_for_tests(PERFTRACKER_TOKEN=shared.token),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from perftracker.wire import framing as wire

        deadline = time.monotonic() + 20
        while not Path(wire.socket_path(run_dir)).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        sock, ack = _register(run_dir, "mj2", 1, 4, pending=True)
        assert ack.get("ok") and FEATURE not in ack.get("features", [])
        deadline = time.monotonic() + 15
        while "mj2" not in Uplink(shared.url, shared.token).jobs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "mj2" in Uplink(shared.url, shared.token).jobs()  # not held: the shared localizer is the job's
        sock.close()
    finally:
        proc.kill()
        proc.wait(10)
        shared.stop()
