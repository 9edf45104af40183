"""`perftracker analyze` on the real multi-group traces (issue 28): the 64-worker DP32 x PP2 job in
shared/data/sa_se_kineto, whose authors attribute its slowdown to sequence-length imbalance (a
different data-parallel rank slowest in each step, per-rank means even) and a second pipeline stage
that computes about 1.5x the first. The report names both causes and no single rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from perftracker.localizer.diagnose.verdict.group_findings import MOVING_KEY, STAGE_KEY

from perftracker.cli.analyze import localize_summaries, summarize_dir
from tests.conftest import REPO

SA_SE_DIR = Path(os.environ.get("PERFTRACKER_SA_SE_DIR") or REPO.parent / "shared" / "data" / "sa_se_kineto")


@pytest.fixture(scope="module")
def sa_se_report():  # type: ignore[no-untyped-def]
    if not SA_SE_DIR.is_dir():
        pytest.skip(f"no {SA_SE_DIR}")
    summ = summarize_dir(SA_SE_DIR, jobs=2)
    return localize_summaries(summ, SA_SE_DIR)


def test_sa_se_names_the_heavy_stage_and_the_moving_imbalance(sa_se_report) -> None:  # type: ignore[no-untyped-def]
    keys = [f.key for f in sa_se_report.findings]
    assert STAGE_KEY in keys and MOVING_KEY in keys
    stage = next(f for f in sa_se_report.findings if f.key == STAGE_KEY)
    assert set(stage.ranks) == set(range(1, 64, 2))  # stage 1: every odd rank
    assert "pipeline stage 1" in stage.sentence and "stage 0" in stage.sentence
    moving = next(f for f in sa_se_report.findings if f.key == MOVING_KEY)
    assert "changes from step to step" in moving.sentence
    assert "groups: read" in sa_se_report.summary


def test_sa_se_names_no_single_rank(sa_se_report) -> None:  # type: ignore[no-untyped-def]
    assert all(len(f.ranks) >= 32 for f in sa_se_report.findings)


def test_dlrm_says_its_groups_are_inferred(dlrm_dir: Path) -> None:
    report = localize_summaries(summarize_dir(dlrm_dir, jobs=2), dlrm_dir)
    assert "groups: inferred (one group)" in report.summary
    assert report.findings and report.findings[0].ranks == (4, 5)


def test_the_mutator_keeps_the_traces_groups() -> None:
    """bench/tracefault reads each kernel's own group and pairs a send with its recv by Src/Dst
    Rank and Seq: instances of the real traces are pipeline pairs and data-parallel groups of 32."""
    from collections import Counter

    from bench.tracefault.build import build
    from bench.tracefault.traces import read_trace_dir

    if not SA_SE_DIR.is_dir():
        pytest.skip(f"no {SA_SE_DIR}")
    jg = build(read_trace_dir(SA_SE_DIR))
    assert set(Counter(len(i.members) for i in jg.instances)) == {2, 32}
