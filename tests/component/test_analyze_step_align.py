"""``perftracker analyze``'s directory path (summarize_dir's worker processes, then the localizer)
on a 2-rank job whose ranks recorded different steps (tests/step_traces.py): the cut is one
warning naming ranks and steps, both ranks are reported, a clean job has no finding and a slowed
rank is still found. Pure cases: tests/unit/test_step_align.py."""

from __future__ import annotations

from pathlib import Path

from perftracker.cli.analyze import localize_summaries, summarize_dir
from tests.step_traces import job_docs, write_job

STEPS = [1, 2, 3, 4, 5, 6]


def test_clean_job_with_a_misaligned_tail(tmp_path: Path) -> None:
    d = write_job(tmp_path / "clean", job_docs({0: STEPS, 1: [*STEPS, 7]}, {0: 4000.0, 1: 4000.0},
                                               {1: {7: 30000.0}}, seed=11))
    warned: list[str] = []
    summ = summarize_dir(d, jobs=2, warn=warned.append)
    assert warned == ["ranks compared over the steps all recorded (steps 1-6); cut: rank 1 step 7"]
    assert [ps.rank for ps in summ.sets] == [0, 1]
    assert summ.sets[1].window_end_ns - summ.sets[1].window_start_ns < 1.2 * (
        summ.sets[0].window_end_ns - summ.sets[0].window_start_ns)
    report = localize_summaries(summ, d)
    assert not report.findings, [f.sentence for f in report.findings]
    assert report.trigger_reason == f"offline: {d}; {warned[0]}"  # the cut, in the report too


def test_slowed_rank_with_a_misaligned_tail(tmp_path: Path) -> None:
    d = write_job(tmp_path / "slow", job_docs({0: STEPS, 1: [*STEPS, 7]}, {0: 4000.0, 1: 6000.0},
                                              {1: {7: 30000.0}}, seed=12))
    summ = summarize_dir(d, jobs=2)
    report = localize_summaries(summ, d)
    assert [(f.key, f.ranks) for f in report.findings] == [("aten::mm", (1,))]
