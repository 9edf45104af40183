"""One localizer per job across nodes (issue 42), its parts on one machine: the worker's job link
against a real c10d store, the embedded localizer serving a job on a second address with a job
token, and the agent's routed uplink against two real localizers."""

from __future__ import annotations

import datetime
import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist
from perftracker.agent.daemon.job_routes import RoutedUplink
from perftracker.agent.daemon.localizer_client import Uplink
from perftracker.localizer.service.embedded import (
    EmbeddedError,
    job_records,
    record_served_job,
    start_embedded,
)

from perftracker.runtime.job_link import (
    FEATURE,
    STORE_KEY,
    JobLink,
    JobRoute,
    bind_address,
    is_loopback,
    route_source,
    spans_nodes,
)
from perftracker.wire.framing import MessageType
from tests.service_helpers import make_pattern_set, workers

ACK = {"features": [FEATURE]}


def _ident(rank: int, world: int = 4, local_rank: int = 0, job: str = "j") -> SimpleNamespace:
    return SimpleNamespace(rank=rank, world_size=world, local_rank=local_rank, job=job, settled=True,
                           source="process group")


@pytest.fixture()
def store() -> Any:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False)


def test_spans_nodes_reads_the_launchers_environment() -> None:
    assert spans_nodes({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}) is True
    assert spans_nodes({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}) is False
    assert spans_nodes({"SLURM_NNODES": "2"}) is True
    assert spans_nodes({"SLURM_JOB_NUM_NODES": "1"}) is False
    assert spans_nodes({}) is None
    assert spans_nodes({"WORLD_SIZE": "x", "LOCAL_WORLD_SIZE": "4"}) is None


def test_bind_address_is_the_interface_named_or_the_route_to_the_master() -> None:
    assert bind_address({"GLOO_SOCKET_IFNAME": "lo"}) == "127.0.0.1"
    assert bind_address({"NCCL_SOCKET_IFNAME": "=lo,eth9"}) == "127.0.0.1"
    # an exclusion names no interface: the route to the master decides
    assert bind_address({"NCCL_SOCKET_IFNAME": "^docker", "MASTER_ADDR": "127.0.0.1"}) == "127.0.0.1"
    assert bind_address({"MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}) in ("127.0.0.1", "::1")
    assert bind_address({}) is None and bind_address({"GLOO_SOCKET_IFNAME": "nosuchif0"}) is None
    assert route_source("no-such-host.invalid") is None
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("10.1.2.3") and is_loopback("junk")


def test_a_one_node_job_sends_nothing(store: Any) -> None:
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "GLOO_SOCKET_IFNAME": "lo"}
    link = JobLink(lambda: _ident(0), env=env, store=lambda: store)
    assert link.messages(ACK) == [] and not link.pending()
    # a job whose master is reached over loopback cannot span nodes either
    link = JobLink(lambda: _ident(0), env={"MASTER_ADDR": "127.0.0.1"}, store=lambda: store)
    assert link.messages(ACK) == []
    # torchrun's several "nodes" on one host (master on loopback): no rank says pending, none serves
    for rank in (0, 1):
        lo = JobLink(lambda r=rank: _ident(r), env={"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                                                    "MASTER_ADDR": "127.0.0.1"}, store=lambda: store)
        assert not lo.pending() and lo.messages(ACK) == []


def test_a_shared_localizer_or_an_older_agent_turns_it_off(store: Any) -> None:
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1"}
    assert JobLink(lambda: _ident(0), localizer_url="http://svc:8765", env=env, store=lambda: store).messages(ACK) == []
    assert not JobLink(lambda: _ident(0), localizer_url="http://svc:8765", env=env, store=lambda: store).pending()
    assert JobLink(lambda: _ident(0), env=env, store=lambda: store).messages({"features": []}) == []
    unsettled = SimpleNamespace(**{**vars(_ident(0)), "settled": False})
    assert JobLink(lambda: unsettled, env=env, store=lambda: store).messages(ACK) == []


def test_rank0_serves_publishes_and_the_others_follow_every_change(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import perftracker.runtime.job_link as jl

    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    monkeypatch.setattr(jl, "bind_address", lambda env, master=None: "10.9.8.7")  # a node's job interface
    now = [0.0]
    zero = JobLink(lambda: _ident(0), env=env, store=lambda: store)
    two = JobLink(lambda: _ident(2), env=env, store=lambda: store, clock=lambda: now[0])
    monkeypatch.setitem(env, "MASTER_ADDR", "10.9.8.1")
    assert zero.pending() and two.pending()
    assert two.messages(ACK) == []  # nothing published yet
    (serve,) = zero.messages(ACK)
    assert serve["type"] == MessageType.JOB_SERVE.value and serve["host"] == "10.9.8.7" and serve["port"] == 0
    assert zero.messages(ACK) == []  # asked once per agent
    zero.on_served({"job": "j", "url": "http://10.9.8.7:4000", "agent_id": "node0-1", "error": ""})
    assert JobRoute.from_json(store.get(STORE_KEY).decode()) == JobRoute("http://10.9.8.7:4000", serve["token"], "node0-1")
    now[0] = 1.0
    (route,) = two.messages(ACK)
    assert route["type"] == MessageType.JOB_ROUTE.value
    assert (route["url"], route["token"], route["served_by"]) == ("http://10.9.8.7:4000", serve["token"], "node0-1")
    now[0] = 5.0
    assert two.messages(ACK) == []  # unchanged, and re-read only every RECHECK_S
    # rank 0's agent restarted: rank 0 serves again and the others follow the new URL
    zero.agent_changed()
    (again,) = zero.messages(ACK)
    zero.on_served({"job": "j", "url": "http://10.9.8.7:4100", "agent_id": "node0-2", "error": ""})
    now[0] = 5.0 + jl.RECHECK_S + 0.1
    (moved,) = two.messages(ACK)
    assert moved["url"] == "http://10.9.8.7:4100" and moved["served_by"] == "node0-2"
    # a new agent on rank 2's node is told at once
    two.agent_changed()
    (told,) = two.messages(ACK)
    assert told["url"] == "http://10.9.8.7:4100"
    # the other ranks of a node leave it to its local rank 0: no store reads of theirs
    reads: list[int] = []

    class Counting:
        def check(self, keys: list[str]) -> bool:
            reads.append(1)
            return bool(store.check(keys))

        def get(self, key: str) -> bytes:
            return bytes(store.get(key))

    three = JobLink(lambda: _ident(3, local_rank=1), env=env, store=lambda: Counting(), clock=lambda: now[0])
    assert three.messages(ACK) == [] and reads == []
    # an agent that cannot serve: nothing is published, the old value stays
    zero.agent_changed()
    zero.messages(ACK)
    zero.on_served({"job": "j", "url": "", "agent_id": "x", "error": "reports to a shared localizer"})
    assert json.loads(store.get(STORE_KEY))["url"] == "http://10.9.8.7:4100"


def test_a_job_served_on_a_second_address_takes_only_its_token(tmp_path: Path) -> None:
    """The embedded localizer's job site: the job token may register and read its job, never another,
    and the localizer's own token never leaves the node (served URL != its loopback URL)."""
    loc = start_embedded(tmp_path / "runs")
    try:
        token = "job-token-" + "x1y2z3" * 4
        url = loc.serve_job("jobA", "127.0.0.2", 0, token)
        assert url.startswith("http://127.0.0.2:") and url != loc.url
        assert loc.serve_job("jobA", "127.0.0.2", 0, token) == url  # the same listener
        job_up = Uplink(url, token, retries=0)
        job_up.register("jobA", "agent-b", "node1", workers(range(2, 4), 4))
        assert "jobA" in Uplink(loc.url, loc.token).jobs()
        with pytest.raises(Exception, match="403"):
            job_up.register("jobB", "agent-b", "node1", workers(range(0, 2), 4))
        with pytest.raises(Exception, match="401"):
            Uplink(url, "wrong-token-" + "q" * 16, retries=0).jobs()
        with pytest.raises(EmbeddedError, match="at least 16"):  # a weak job token is refused
            loc.serve_job("jobC", "127.0.0.2", 0, "short")
        rec = job_records(tmp_path / "runs")
        assert [(r["job"], r["url"], r["token"]) for r in rec] == [("jobA", url, "")]
    finally:
        loc.stop()


def test_the_routed_uplink_sends_a_job_to_its_localizer_and_the_rest_to_its_own(tmp_path: Path) -> None:
    own = start_embedded(tmp_path / "own")
    other = start_embedded(tmp_path / "other")
    try:
        token = "routed-token-" + "a7b8c9" * 4
        url = other.serve_job("multi", "127.0.0.3", 0, token)
        seen: list[tuple[str, str, str]] = []
        up = RoutedUplink(Uplink(own.url, own.token), lambda u, t: Uplink(u, t),
                          on_route=lambda j, u, t: seen.append((j, u, t)))
        assert up.route("multi", url, token) and not up.route("multi", url, token)
        assert seen == [("multi", url, token)] and up.route_of("multi") == url and up.route_of("solo") is None
        for job, ranks in (("multi", range(2, 4)), ("solo", range(0, 1))):
            up.register(job, "agent-1", "node1", workers(ranks, 4 if job == "multi" else 1))
        assert Uplink(other.url, other.token).jobs() == ["multi"]
        assert Uplink(own.url, own.token).jobs() == ["solo"]
        session, _ = up.create_trigger("multi", "on-demand")
        notice = up.poll_trigger("multi", None, 5.0)
        assert notice is not None and notice.session == session
        up.upload_pattern_batch([make_pattern_set("multi", session, r, 4) for r in (2, 3)])
        info = Uplink(other.url, other.token).get_session(session)
        assert sorted(info["uploaded"]) == [2, 3]
        record_served_job(tmp_path / "own", "multi", url, token)
        assert job_records(tmp_path / "own")[0]["token"] == token
    finally:
        own.stop()
        other.stop()


def test_report_on_any_node_reaches_the_jobs_localizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`perftracker report` on a node whose ranks report elsewhere reads the job's report there; an
    unreachable job localizer is a clear error naming it."""
    from perftracker.cli.main import main

    node0, node1 = tmp_path / "n0" / "perftracker-runs", tmp_path / "n1" / "perftracker-runs"
    loc0, loc1 = start_embedded(node0), start_embedded(node1)
    try:
        token = "job-token-" + "k9m8n7" * 4
        url = loc0.serve_job("multi", "127.0.0.4", 0, token)
        record_served_job(node1, "multi", url, token)
        monkeypatch.chdir(tmp_path / "n1")
        monkeypatch.delenv("PERFTRACKER_STORE", raising=False)
        assert main(["report", "latest"]) == 1  # nothing anywhere yet: one clear line, exit 1
        up = Uplink(url, token)
        up.register("multi", "a0", "node0", workers(range(0, 2), 2))
        session, _ = up.create_trigger("multi", "on-demand")
        up.upload_pattern_batch([make_pattern_set("multi", session, r, 2) for r in (0, 1)])
        import time

        deadline = time.monotonic() + 20
        while up.get_report(session) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert main(["report", "latest", "--format", "json", "-o", str(tmp_path / "r.json")]) == 0
        assert json.loads((tmp_path / "r.json").read_text())["session"] == session
    finally:
        loc0.stop()
        loc1.stop()
    capsys.readouterr()
    assert main(["report", session]) == 1  # the job's localizer is gone: an error that names it
    assert f"job multi's localizer at {url}" in capsys.readouterr().err

