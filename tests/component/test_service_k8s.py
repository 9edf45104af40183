"""The localizer service with its Kubernetes integration, through the real service over real sockets.

The API server is a local HTTP socket answering with the recorded API-format JSON of
tests/fixtures/k8s/ (job "train" in namespace "perftracker": pods train-0 and train-1, 2 ranks each),
and the real `kubernetes` client talks to it. Not verified on a cluster.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is in the k8s extra")

from perftracker.agent.daemon.localizer_client import Uplink  # noqa: E402
from perftracker.localizer.k8s.client import K8sOptions, KubernetesClient  # noqa: E402
from perftracker.localizer.service.http_service import ServiceOptions  # noqa: E402
from perftracker.localizer.service.session.manager import SessionOptions  # noqa: E402

from perftracker.model import Category, Pattern  # noqa: E402
from tests.k8s_fake import FakeApiServer  # noqa: E402
from tests.service_helpers import TOKEN, ServiceThread, make_pattern_set, workers  # noqa: E402

SA_TOKEN = "sa-token-for-service-tests"
POD_OF_RANK = {0: "train-0-7xk2p", 1: "train-0-7xk2p", 2: "train-1-h2w9r", 3: "train-1-h2w9r"}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(SA_TOKEN) as server:
        yield server


def _options(**kw: Any) -> ServiceOptions:
    return ServiceOptions(sessions=SessionOptions(default_window_s=0.5, collect_grace_s=1.0), **kw)


def _client(api: FakeApiServer) -> KubernetesClient:
    return KubernetesClient.for_host(api.url, K8sOptions(namespace="perftracker", instance="loc-0", timeout_s=5),
                                     token=SA_TOKEN)


def _wait(pred: Any, timeout_s: float = 30.0) -> Any:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def _closed(up: Uplink, session: str) -> dict[str, Any] | None:
    s = up.get_session(session)
    return s if s["state"] in ("done", "failed") else None


def _patterns(session: str, rank: int, world_size: int, slow_python: bool = False) -> Any:
    ps = make_pattern_set("train", session, rank, world_size)
    if not slow_python:
        return ps
    stall = Pattern("train.py:120 in main;loader.py:51 in next_batch;socket.py:720 in recv_into", Category.PYTHON,
                    0.35, 0.05, 0.01, label="socket.py:720 in recv_into", executions=40, critical_ns=7 * 10**9,
                    resource="cpu")
    return dataclasses.replace(ps, patterns=(*ps.patterns, stall))


def test_session_expects_the_pods_ranks_and_findings_become_pod_events(api: FakeApiServer, tmp_path: Path) -> None:
    # the answer waits up to k8s_lookup_wait_s for the listing (2 x 0.8 s here): 5 s, the default, is
    # too short on a loaded CI machine (the first listing also imports the kubernetes client's models).
    # The session must stay open through the listing, the joining trigger and the 4 uploads (it closes
    # as soon as all 4 ranks uploaded): a 1 s collect grace expired before the join on a loaded machine.
    options = ServiceOptions(sessions=SessionOptions(default_window_s=0.5, collect_grace_s=60.0),
                             k8s_lookup_wait_s=30.0)
    with ServiceThread(tmp_path / "store.sqlite", options, k8s_client=_client(api)) as svc:
        up = Uplink(svc.url, TOKEN)
        up.register("train", "agent-a", "gpu-node-a", workers(range(2), 2))  # only pod train-0's agent registered
        assert api.pod_listings() == []  # nothing is asked of the API server before a session opens

        # the pod listing is slow: the trigger's answer waits for it, the event loop does not
        api.delay_s = 0.8
        answer: list[tuple[str, bool]] = []
        t0 = time.monotonic()
        trig = threading.Thread(target=lambda: answer.append(up.create_trigger("train", "cli", window_s=0.5)))
        trig.start()
        health_ms = []
        while trig.is_alive():
            h0 = time.monotonic()
            with urllib.request.urlopen(svc.url + "/v1/healthz", timeout=5) as r:
                assert r.status == 200
            health_ms.append((time.monotonic() - h0) * 1000)
            time.sleep(0.05)
        trig.join()
        api.delay_s = 0.0
        assert time.monotonic() - t0 >= 1.6  # two pages of 0.8 s each were listed before the answer
        assert len(health_ms) >= 5 and max(health_ms) < 500, health_ms

        session, joined = answer[0]
        assert not joined
        listings = api.pod_listings()
        assert len(listings) == 2 and all(q["labelSelector"] == ["job-name=train"] for q in listings)
        s = up.get_session(session)
        assert s["expected"] == [0, 1, 2, 3]  # registrations (0, 1) merged with the pods' ranks (0-3)
        assert up.create_trigger("train", "again") == (session, True)
        assert len(api.pod_listings()) == 2  # a joining trigger does not list again

        # ranks 2 and 3 were never registered, but the cluster says they exist: their uploads count
        for rank in range(4):
            ack = up.upload_patterns(_patterns(session, rank, 4, slow_python=rank == 3))
            assert ack["stored"] and ack["expected"] == 4
        closed = _wait(lambda: _closed(up, session))
        assert closed["state"] == "done", closed["error"]
        report = up.get_report(session)
        assert report is not None and report.status == "complete"
        slow = [f for f in report.findings if 3 in f.ranks]
        assert slow, [(f.function, f.ranks) for f in report.findings]

        # Events are posted after the report is stored, on the pods of the ranks with findings
        events = _wait(api.posted_events)
        time.sleep(0.3)  # let the remaining posts of this report arrive
        events = api.posted_events()
        on_pods = {e["involvedObject"]["name"] for e in events}
        expected_pods = {POD_OF_RANK[r] for f in report.findings for r in f.ranks}
        assert on_pods == expected_pods and "train-1-h2w9r" in on_pods
        ev = next(e for e in events if e["involvedObject"]["name"] == "train-1-h2w9r"
                  and slow[0].sentence in e["message"])
        assert ev["type"] == "Warning" and ev["reason"] == "PerftrackerFinding"
        assert session in ev["message"] and "[ranks on this pod: " in ev["message"]
        assert ev["source"]["host"] == "gpu-node-b" and ev["metadata"]["namespace"] == "perftracker"
        assert len(api.pod_listings()) == 2  # the session's topology was reused for the Events


def test_pod_listing_failure_falls_back_to_the_registrations(api: FakeApiServer, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="localizer")
    api.forbid = True
    with ServiceThread(tmp_path / "store.sqlite", _options(), k8s_client=_client(api)) as svc:
        up = Uplink(svc.url, TOKEN)
        up.register("train", "agent-a", "gpu-node-a", workers(range(2), 2))
        session, _ = up.create_trigger("train", "cli", window_s=0.5)
        assert up.get_session(session)["expected"] == [0, 1]
        assert "expected ranks from the registrations only" in caplog.text and "pods is forbidden" in caplog.text
        for rank in range(2):
            up.upload_patterns(_patterns(session, rank, 2, slow_python=rank == 1))
        closed = _wait(lambda: _closed(up, session))
        assert closed["state"] == "done" and closed["missing"] == []
        report = up.get_report(session)
        assert report is not None and report.status == "complete" and report.findings
        _wait(lambda: "no Kubernetes Events posted" in caplog.text)
        assert api.posted_events() == []


def test_outside_a_cluster_kubernetes_is_a_no_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with ServiceThread(tmp_path / "store.sqlite", _options(), k8s_client=None) as svc:
        assert svc.service.k8s is None and svc.service.cluster is None  # from_environment() said None
        up = Uplink(svc.url, TOKEN)
        up.register("train", "agent-a", "node0", workers(range(2), 2))
        session, _ = up.create_trigger("train", "cli", window_s=0.5)
        assert up.get_session(session)["expected"] == [0, 1]
        for rank in range(2):
            up.upload_patterns(_patterns(session, rank, 2))
        assert _wait(lambda: _closed(up, session))["state"] == "done"


def test_a_session_opened_before_a_restart_still_gets_its_events(api: FakeApiServer, tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    with ServiceThread(store, _options(kubernetes=False), k8s_client=None) as svc:  # e.g. the API was unreachable then
        up = Uplink(svc.url, TOKEN)
        up.register("train", "agent-a", "gpu-node-a", workers(range(4), 4))
        session, _ = up.create_trigger("train", "cli", window_s=30)
        for rank in range(3):
            up.upload_patterns(_patterns(session, rank, 4))
    assert api.pod_listings() == []
    with ServiceThread(store, _options(), k8s_client=_client(api)) as svc:  # restarted, now with the cluster
        up.url = svc.url  # the same agent (it holds its agent key) reaches the restarted localizer
        up.upload_patterns(_patterns(session, 3, 4, slow_python=True))
        closed = _wait(lambda: _closed(up, session))
        assert closed["state"] == "done" and closed["uploaded"] == [0, 1, 2, 3]
        events = _wait(api.posted_events)
        assert any(e["involvedObject"]["name"] == "train-1-h2w9r" and session in e["message"] for e in events)
        assert len(api.pod_listings()) == 2  # listed (two pages) when the report was stored
