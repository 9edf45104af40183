"""One report per job across nodes, with nothing to set up (issue 42): real torchrun jobs on emulated
nodes (network namespaces, own host names, temp dirs and working dirs: tests/multinode_job.py),
``import perftracker`` as the only change, no localizer URL anywhere."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from bench.faultkit.hosts import namespaces_available
from tests.multinode_job import MultiNodeJob

NETNS, WHY = namespaces_available()
pytestmark = [pytest.mark.skipif(not NETNS, reason=f"network namespaces unavailable: {WHY}"),
              pytest.mark.timeout(420)]

ENV = {"PERFTRACKER_WINDOW_S": "4", "PERFTRACKER_SLOWDOWN_THRESHOLD": "5"}  # on-demand windows only
SLOW = ["--iters", "100000", "--seed", "3", "--fault", "compute:where=forward,frac=1.0", "--fault-ranks", "3",
        "--fault-start-iter", "0"]


SESSION = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")


def _trigger(job: MultiNodeJob, node: int) -> str:
    res = job.nodes[node].run(["perftracker", "trigger", "--job", job.job, "--window-s", "4", "--timeout-s", "200"],
                              timeout_s=240)
    assert res.returncode == 0, f"trigger on node{node}: {res.stdout}\n{res.stderr}\n{job.logs()}"
    found = SESSION.search(res.stdout + res.stderr)
    assert found, res.stdout + res.stderr
    return found.group(0)


def test_a_slow_rank_on_the_second_node_is_named_in_one_report_of_every_rank(tmp_path: Path) -> None:
    with MultiNodeJob(tmp_path, nodes=2, per_node=2, script_args=SLOW, extra_env=ENV) as job:
        job.wait_iterations(40, timeout_s=180)
        session = _trigger(job, node=1)  # asked on the second node: reaches the job's one localizer
        rep = job.report_json(node=0, session=session)
        assert rep["job"] == job.job
        assert sorted(rep["ranks_reported"]) == [0, 1, 2, 3] and rep["ranks_missing"] == [], rep["headline"]
        first = rep["findings"][0]
        assert 3 in first["ranks"] and len(first["ranks"]) < 4, rep["headline"]
        assert first["category"] == "compute", first
        # the second node prints the same report (from the job's localizer on node 0)
        rep1 = job.report_json(node=1, session=session)
        assert rep1 == rep
        latest = job.report_json(node=1)
        assert latest["job"] == job.job and sorted(latest["ranks_reported"]) == [0, 1, 2, 3]
        # each node's agent runs apart: node 1's own store holds no session of this job's report
        assert not (job.nodes[1].work / "perftracker-runs" / "reports" / f"{rep['session']}.json").exists()
        # rank 0's training log says where the report is
        deadline = time.monotonic() + 20
        while "report of session" not in job.nodes[0].log.read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert f"report of session {rep['session']}" in job.nodes[0].log.read_text(errors="replace")


def test_a_clean_two_node_job_blames_no_rank(tmp_path: Path) -> None:
    """The twin: the same job with no fault must name no rank (one report of every rank)."""
    clean = ["--iters", "100000", "--seed", "3"]
    with MultiNodeJob(tmp_path, nodes=2, per_node=2, script_args=clean, extra_env=ENV) as job:
        job.wait_iterations(40, timeout_s=180)
        session = _trigger(job, node=0)
        rep = job.report_json(node=1, session=session)
        assert sorted(rep["ranks_reported"]) == [0, 1, 2, 3] and rep["ranks_missing"] == []
        blamed = [f for f in rep["findings"] if f["category"] == "compute" and len(f["ranks"]) < 4]
        assert not blamed, rep["headline"]


def test_the_localizers_node_killed_mid_window(tmp_path: Path) -> None:
    """Node 0's agent (the job's localizer) is killed during a window: training goes on everywhere,
    node 1 keeps its window and patterns on disk and says so in its training log, and the next
    trigger reaches the localizer that rank 0 restarts."""
    with MultiNodeJob(tmp_path, nodes=2, per_node=2, script_args=SLOW,
                      extra_env={**ENV, "PERFTRACKER_WINDOW_S": "8"}) as job:
        job.wait_iterations(40, timeout_s=180)
        node0, node1 = job.nodes
        proc = node1.run(["perftracker", "trigger", "--job", job.job, "--no-wait"])
        assert proc.returncode == 0, proc.stderr
        time.sleep(3)  # inside the 8 s window
        pid = node0.agent_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        before = [job.iteration(r) for r in range(4)]
        time.sleep(20)
        after = [job.iteration(r) for r in range(4)]
        assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)  # training went on
        assert all(p.poll() is None for p in job.procs)
        kept = list((node1.run_dir / "agent").glob("*.patterns")) + list((node1.run_dir / "windows").glob("*"))
        assert kept, job.logs()  # nothing lost: node 1's windows and patterns stay on disk
        log1 = node1.log.read_text(errors="replace")
        assert "no report will come" in log1 and "stay in" in log1, job.logs()
        # rank 0 restarts its agent and publishes the new localizer; the next trigger has every rank
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if node0.agent_pid() not in (None, pid):
                break
            time.sleep(1)
        time.sleep(12)  # the other ranks re-read the store every 10 s
        session = _trigger(job, node=1)
        rep = job.report_json(node=0, session=session)
        assert sorted(rep["ranks_reported"]) == [0, 1, 2, 3], rep["ranks_missing"]
        assert 3 in rep["findings"][0]["ranks"]
