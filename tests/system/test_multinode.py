"""One report per job across nodes, with nothing to set up (issue 42): real torchrun jobs on emulated
nodes (network namespaces, own host names, temp dirs and working dirs: tests/multinode_job.py),
``import perftracker`` as the only change, no localizer URL anywhere."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.faultkit.hosts import namespaces_available
from bench.faultkit.nodes import MultiNodeJob

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
        job.wait_linked()
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


def test_the_localizers_node_killed_mid_window(tmp_path: Path) -> None:
    """Node 0's agent (the job's localizer) and its helpers are killed during a window: training goes
    on everywhere; node 1's window is not lost (its patterns reach the localizer that rank 0 restarts
    on the same store, or they stay on disk and node 1's training log says where); the next trigger
    reaches the restarted localizer and has every rank."""
    with MultiNodeJob(tmp_path, nodes=2, per_node=2, script_args=SLOW,
                      extra_env={**ENV, "PERFTRACKER_WINDOW_S": "6"}) as job:
        job.wait_iterations(40, timeout_s=180)
        job.wait_linked()
        node0, node1 = job.nodes
        proc = node1.run(["perftracker", "trigger", "--job", job.job, "--no-wait"])
        assert proc.returncode == 0, proc.stderr
        found = SESSION.search(proc.stdout + proc.stderr)
        assert found, proc.stdout + proc.stderr
        first = found.group(0)
        time.sleep(2.5)  # inside the 6 s window
        pid = node0.agent_pid()
        assert pid is not None
        agent = psutil.Process(pid)
        for p in [agent, *agent.children(recursive=True)]:  # the node's agent and its helpers die at once
            p.kill()
        before = [job.iteration(r) for r in range(4)]
        deadline = time.monotonic() + 60
        while node0.agent_pid() in (None, pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert node0.agent_pid() not in (None, pid), job.logs()  # rank 0 started a new agent
        time.sleep(1.0)
        after = [job.iteration(r) for r in range(4)]
        assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)  # training went on
        assert all(p.poll() is None for p in job.procs)
        # nothing lost: node 1's patterns of the cut session reached the restarted localizer (its
        # agent says it uploaded them), or they stay on disk and node 1's training log says where
        agent_log = node1.run_dir / "agent.log"
        deadline = time.monotonic() + 60
        reached = kept = False
        while time.monotonic() < deadline and not (reached or kept):
            reached = f"session {first}: uploaded rank(s) [2, 3]" in agent_log.read_text(errors="replace")
            kept = ("stay in" in node1.log.read_text(errors="replace")
                    and bool(list((node1.run_dir / "agent").rglob("*.patterns"))))
            time.sleep(0.5)
        assert reached or kept, job.logs()
        record = node1.work / "perftracker-runs" / "jobs" / f"{job.job}.json"
        served = node0.work / "perftracker-runs" / "jobs" / f"{job.job}.json"
        deadline = time.monotonic() + 30  # node 1 follows the restarted localizer (re-read every 5 s)
        while time.monotonic() < deadline and json.loads(record.read_text())["url"] != json.loads(
                served.read_text())["url"]:
            time.sleep(0.5)
        assert json.loads(record.read_text())["url"] == json.loads(served.read_text())["url"], job.logs()
        session = _trigger(job, node=1)
        rep = job.report_json(node=0, session=session)
        assert sorted(rep["ranks_reported"]) == [0, 1, 2, 3], rep["ranks_missing"]


def _hang_culprits(rep: dict[str, Any]) -> dict[int, str]:
    return {int(s["rank"]): str(s["state"]) for s in rep.get("hang_states", []) if s["state"] in ("culprit", "silent")}


def test_a_hang_on_the_second_node_is_named_in_the_jobs_one_report(tmp_path: Path) -> None:
    hang = ["--iters", "100000", "--seed", "3", "--fault", "hang:at_iter=80", "--fault-ranks", "3"]
    with MultiNodeJob(tmp_path, nodes=2, per_node=2, script_args=hang, extra_env=ENV) as job:
        job.wait_iterations(79, timeout_s=180)
        deadline = time.monotonic() + 120
        rep: dict[str, Any] = {}
        while time.monotonic() < deadline:
            res = job.nodes[0].run(["perftracker", "report", "latest", "--format", "json"])
            if res.returncode == 0:
                rep = json.loads(res.stdout)
                if rep.get("kind") == "hang":
                    break
            time.sleep(2)
        assert rep.get("kind") == "hang", job.logs()
        assert _hang_culprits(rep) == {3: "culprit"}, rep.get("summary")
        assert sorted(int(s["rank"]) for s in rep["hang_states"]) == [0, 1, 2, 3]
