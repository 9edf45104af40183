"""A real DP2 x PP2 gloo job (tests/framework_jobs/pp_dp_gloo.py: 4 CPU ranks, pipeline send/recv
in two pipeline groups, gradient all-reduce in two data-parallel groups) with one rank slowed by
extra compute (issue 28). Live through `perftracker run` (the process groups and each collective's
group come from the runtime, perftracker/runtime/dist_record.py) and offline through `perftracker
analyze` of the job's own torch.profiler traces. The report headlines the slowed rank, not its
victims, and carries the other three ranks' waits; the clean twin blames no rank (a job-wide
finding, such as the job's own storage wait on every rank, names no culprit).

In the integration tier, not CI: 4 CPU ranks on a 2-core host are not steady enough. Measured here
(load 4-17): the live culprit case passed 2 of 4 runs (a CPU-starved rank blamed once, rank 0
named with no cause once); the offline culprit case passed 4 of 5; the offline clean twin failed 2
of 4 (rank 0's aten::tanh 14% against 11%, or one rank's recv 3.3x, as a rank-specific finding: on
shared cores contention is a real imbalance in wall time, which the method reports as it sees it).

Topology: stage = rank % 2; pipelines {0, 1}, {2, 3}; data-parallel groups {0, 2}, {1, 3}. Rank 2
slowed: rank 3 (its pipeline successor) waits in recv, rank 0 (its data-parallel peer) in the
all-reduce, rank 1 in the all-reduce for rank 3, one hop further.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import REPO, env_for_tests, wait_until

JOB = str(REPO / "tests" / "framework_jobs" / "pp_dp_gloo.py")
SLOW = 2
ALL = {0, 1, 2, 3}
KEEP = ("--keep-windows",) if os.environ.get("KEEP28") else ()


def _iteration(progress: Path, rank: int) -> int:
    try:
        return int((progress / f"rank{rank}.iter").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1


def _live_report(tmp_path: Path, slow_rank: int, window_s: float = 3.0):  # type: ignore[no-untyped-def]
    from perftracker.agent.daemon.localizer_client import Uplink

    progress = tmp_path / "progress"
    progress.mkdir()
    env = env_for_tests(PERFTRACKER_JOB_ID="ppdp")
    proc = subprocess.Popen(
        [sys.executable, "-m", "perftracker", "run", "--window-s", str(window_s), "--nproc-per-node", "4", *KEEP, "--",
         JOB, "--slow-rank", str(slow_rank), "--progress-dir", str(progress)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    runs = tmp_path / "perftracker-runs"
    try:
        wait_until(lambda: min(_iteration(progress, r) for r in range(4)) >= 10, 90, what="training")
        info = json.loads((runs / "localizer.json").read_text())
        up = Uplink(info["url"], (runs / "token").read_text().strip(), retries=1)
        wait_until(lambda: "ppdp" in up.jobs(), 30, what="job registered")
        session, _ = up.create_trigger("ppdp", "test", window_s)
        report = wait_until(lambda: up.get_report(session), 90, step_s=0.5, what="report")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert report.ranks_reported == (0, 1, 2, 3), err[-3000:]
    return report


def _traces(tmp_path: Path, slow_rank: int, free_port: int) -> Path:
    out = tmp_path / "traces"
    env = env_for_tests(PERFTRACKER_AUTOSTART_AGENT="0")
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "--master_port", str(free_port), JOB,
         "--steps", "24", "--slow-rank", str(slow_rank), "--trace-dir", str(out), "--trace-from", "8",
         "--trace-steps", "14"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _offline_report(trace_dir: Path):  # type: ignore[no-untyped-def]
    from perftracker.cli.analyze import localize_summaries, summarize_dir

    return localize_summaries(summarize_dir(trace_dir, jobs=2), trace_dir)


def _culprit_first(report) -> None:  # type: ignore[no-untyped-def]
    text = "\n".join(f"{f.ranks} {f.sentence}" for f in report.findings)
    assert report.findings, f"no finding: {report.summary}"
    head = report.findings[0]
    assert head.ranks == (SLOW,), text
    waiting = {r for w in head.waits for r in w.ranks}
    assert {0, 1, 3} <= waiting, text
    for f in report.findings[1:]:  # no victim gets a finding of its own (job-wide ones name every rank)
        assert set(f.ranks) == ALL or not set(f.ranks) & {0, 1, 3}, text


def _no_rank_blamed(report) -> None:  # type: ignore[no-untyped-def]
    """A clean job: no finding names some ranks and not the others (the job's own storage wait,
    the same on every rank, may be a job-wide finding)."""
    assert all(set(f.ranks) == ALL for f in report.findings), \
        "\n".join(f"{f.ranks} {f.sentence}" for f in report.findings)


@pytest.mark.timeout(240)
def test_live_report_headlines_the_slowed_rank(tmp_path: Path) -> None:
    report = _live_report(tmp_path, SLOW)
    assert "groups: read" in report.summary, report.summary
    _culprit_first(report)


# On a 2-core host the 4 CPU ranks (and the host's other load) contend for the cores, and the
# pipeline's schedule makes stage 0's compute run longer in wall time (1.44-1.61x stage 1 in three
# live runs here, a stage imbalance the method reports as it sees it), so the clean twin is
# meaningful only with a core per rank.
@pytest.mark.skipif((os.cpu_count() or 1) < 4, reason="4 ranks on fewer than 4 cores: CPU contention is "
                    "a real imbalance (see above)")
@pytest.mark.timeout(240)
def test_live_clean_job_blames_no_rank(tmp_path: Path) -> None:
    _no_rank_blamed(_live_report(tmp_path, -1))


@pytest.mark.timeout(240)
def test_offline_traces_headline_the_slowed_rank(tmp_path: Path, free_port: int) -> None:
    _culprit_first(_offline_report(_traces(tmp_path, SLOW, free_port)))


@pytest.mark.timeout(240)
def test_offline_clean_traces_blame_no_rank(tmp_path: Path, free_port: int) -> None:
    _no_rank_blamed(_offline_report(_traces(tmp_path, -1, free_port)))
