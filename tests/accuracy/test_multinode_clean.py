"""The twin of tests/system/test_multinode.py's slowed rank (issue 42): the same 2-node x 2-worker job
with no fault must name no rank. Accuracy tier (a statistical property of the method on a live host;
not in CI's run): python -m pytest -q tests/accuracy/test_multinode_clean.py"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.faultkit.hosts import namespaces_available
from bench.faultkit.nodes import MultiNodeJob
from tests.system.test_multinode import ENV, _trigger

NETNS, WHY = namespaces_available()
pytestmark = [pytest.mark.skipif(not NETNS, reason=f"network namespaces unavailable: {WHY}"),
              pytest.mark.timeout(420)]


def test_a_clean_two_node_job_blames_no_rank(tmp_path: Path) -> None:
    """The twin: the same job with no fault must name no rank (one report of every rank)."""
    clean = ["--iters", "100000", "--seed", "3"]
    with MultiNodeJob(tmp_path, nodes=2, per_node=2, script_args=clean, extra_env=ENV) as job:
        job.wait_iterations(40, timeout_s=180)
        job.wait_linked()
        session = _trigger(job, node=0)
        rep = job.report_json(node=1, session=session)
        assert sorted(rep["ranks_reported"]) == [0, 1, 2, 3] and rep["ranks_missing"] == []
        blamed = [f for f in rep["findings"] if f["category"] == "compute" and len(f["ranks"]) < 4]
        assert not blamed, rep["headline"]
