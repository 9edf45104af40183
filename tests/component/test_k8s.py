"""localizer/k8s/client.py against API responses in the API server's JSON (tests/fixtures/k8s/), served
over a real local HTTP socket to the real `kubernetes` client. Not verified on a cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_fake import FIXTURES, FakeApiServer, load_fixture
from report_samples import SLOW_RANK, hang_report, slow_compute_report

pytest.importorskip("kubernetes", reason="the kubernetes client is in the k8s extra")

from perftracker.localizer.k8s.client import (  # noqa: E402
    K8sError,
    K8sOptions,
    KubernetesClient,
    namespace_from_environment,
    rank_labels,
)

TOKEN = "sa-token-for-tests"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(TOKEN) as server:
        yield server


def _client(api: FakeApiServer, **kw: Any) -> KubernetesClient:
    return KubernetesClient.for_host(api.url, K8sOptions(namespace="perftracker", instance="loc-0", **kw), token=TOKEN)


def test_job_topology_maps_ranks_to_pods_and_nodes(api: FakeApiServer) -> None:
    topo = _client(api).job_topology("train")
    # two pages were fetched, with the continue token, and the label selector of the Job
    gets = [r for r in api.requests if r[0] == "GET"]
    assert len(gets) == 2 and all(g[2]["labelSelector"] == ["job-name=train"] for g in gets)
    assert "continue" not in gets[0][2] and gets[1][2]["continue"]
    assert all(g[3] == f"Bearer {TOKEN}" for g in gets)
    assert topo.nproc_per_node == 2 and topo.world_size == 4
    assert topo.expected_ranks == (0, 1, 2, 3)
    # index 1's failed first pod is superseded by its replacement on another node
    assert [(w.rank, w.local_rank, w.pod, w.node) for w in topo.workers] == [
        (0, 0, "train-0-7xk2p", "gpu-node-a"),
        (1, 1, "train-0-7xk2p", "gpu-node-a"),
        (2, 0, "train-1-h2w9r", "gpu-node-b"),
        (3, 1, "train-1-h2w9r", "gpu-node-b"),
    ]
    assert topo.pod_for_rank(3).pod_ip == "10.244.2.41"  # type: ignore[union-attr]
    assert topo.pod_for_rank(4) is None
    assert rank_labels(topo, [0, 3]) == {0: "train-0-7xk2p@gpu-node-a", 3: "train-1-h2w9r@gpu-node-b"}


def test_findings_become_warning_events_on_their_pods(api: FakeApiServer) -> None:
    client = _client(api)
    topo = client.job_topology("train")
    report = slow_compute_report()  # rank 3 slow (pod train-1), ranks 0-2,4-7 wait (4-7 have no pod here)
    names = client.post_report_events(report, topo)
    events = api.posted_events()
    assert len(names) == len(events) == 3  # finding 1 -> train-1; finding 2 -> train-0 (ranks 0,1) and train-1 (rank 2)
    first = events[0]
    assert first["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "train-1-h2w9r", "namespace": "perftracker",
                                       "uid": topo.pod_for_rank(SLOW_RANK).uid}  # type: ignore[union-attr]
    assert first["type"] == "Warning" and first["reason"] == "PerftrackerFinding"
    assert report.findings[0].sentence in first["message"] and report.session in first["message"]
    assert first["message"].endswith("[ranks on this pod: 3]")
    assert first["source"] == {"component": "perftracker-localizer", "host": "gpu-node-b"}
    assert first["reportingComponent"] == "perftracker-localizer" and first["reportingInstance"] == "loc-0"
    assert first["metadata"]["generateName"] == "train-1-h2w9r.perftracker-"
    assert names[0].startswith("train-1-h2w9r.perftracker-")
    assert first["firstTimestamp"].endswith("Z") or "+00:00" in first["firstTimestamp"]
    waits = {e["involvedObject"]["name"]: e["message"] for e in events[1:]}
    assert waits["train-0-7xk2p"].endswith("[ranks on this pod: 0-1]")
    assert waits["train-1-h2w9r"].endswith("[ranks on this pod: 2]")


def test_hang_events_name_culprit_and_silent_ranks(api: FakeApiServer) -> None:
    client = _client(api)
    topo = client.job_topology("train")
    client.post_report_events(hang_report(), topo)  # rank 2 culprit (pod train-1), rank 6 silent (no pod here)
    events = api.posted_events()
    assert len(events) == 1
    assert events[0]["reason"] == "PerftrackerHang"
    assert events[0]["involvedObject"]["name"] == "train-1-h2w9r"
    assert "rank 2 culprit: perftracker/examples/train.py:74 in load_batch" in events[0]["message"]


def test_event_failures_are_logged_not_raised(api: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    client = _client(api)
    topo = client.job_topology("train")
    api.fail_events_for = {"train-1-h2w9r"}
    names = client.post_report_events(slow_compute_report(), topo)
    assert len(names) == 1 and names[0].startswith("train-0-7xk2p.")
    assert "events is forbidden" in caplog.text


def test_api_errors_are_clear(api: FakeApiServer) -> None:
    api.forbid = True
    with pytest.raises(K8sError, match=r"HTTP 403: pods is forbidden: User .* cannot list resource \"pods\""):
        _client(api).job_topology("train")
    api.forbid = False
    with pytest.raises(K8sError, match="no pods with label job-name=other"):
        _client(api).job_topology("other")
    bad = KubernetesClient.for_host(api.url, K8sOptions(namespace="perftracker"), token="wrong")
    with pytest.raises(K8sError, match="HTTP 401"):
        bad.job_topology("train")
    closed = KubernetesClient.for_host("http://127.0.0.1:1", K8sOptions(namespace="perftracker", timeout_s=2), token=TOKEN)
    with pytest.raises(K8sError, match="list pods of job 'train'"):
        closed.job_topology("train")


def test_pods_without_index_or_with_bad_nproc_are_rejected(api: FakeApiServer, tmp_path: Path) -> None:
    page1 = load_fixture("pods_train_page1.json")
    page2 = load_fixture("pods_train_page2.json")
    for p in page1["items"] + page2["items"]:
        p["metadata"]["annotations"]["perftracker.io/nproc-per-node"] = "zero"
    (tmp_path / "pods_train_page1.json").write_text(json.dumps(page1))
    (tmp_path / "pods_train_page2.json").write_text(json.dumps(page2))
    for name in ("status_forbidden.json", "pods_empty.json", "event_created.json"):
        (tmp_path / name).write_text((FIXTURES / name).read_text())
    api.fixtures = tmp_path
    with pytest.raises(K8sError, match="nproc-per-node='zero' must be a positive integer"):
        _client(api).job_topology("train")
    for p in page1["items"] + page2["items"]:
        p["metadata"]["annotations"] = {}
        del p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
    (tmp_path / "pods_train_page1.json").write_text(json.dumps(page1))
    (tmp_path / "pods_train_page2.json").write_text(json.dumps(page2))
    with pytest.raises(K8sError, match="no batch.kubernetes.io/job-completion-index annotation or label"):
        _client(api).job_topology("train")


def test_namespace_from_environment(tmp_path: Path) -> None:
    sa = tmp_path / "namespace"
    assert namespace_from_environment({"PERFTRACKER_K8S_NAMESPACE": "ml"}, sa) == "ml"
    assert namespace_from_environment({}, sa) == ""
    sa.write_text("team-a\n")
    assert namespace_from_environment({}, sa) == "team-a"


def test_from_environment_is_none_outside_a_cluster(caplog: pytest.LogCaptureFixture) -> None:
    from perftracker.localizer.k8s.client import from_environment

    assert from_environment({}) is None
    # a pod without service-account credentials: logged, not raised
    assert from_environment({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "PERFTRACKER_K8S_NAMESPACE": "ml"}) is None
    assert "Kubernetes integration off" in caplog.text
