"""Offline ranks compared over the same steps (``perftracker.agent.summarize.step_align``): a rank
that recorded a step more than the others (a peer stopped profiling to export its trace while it
still recorded, and its allreduce waited for it) read as 'rank 0 arrives last at c10d::allreduce_;
rank 1 waits 37% ... saves ~74%' on a clean job. Twins: the same misaligned tails/heads on a clean
job -> no finding; with a genuinely slowed rank (more compute inside the common steps, near and far
above the bar) -> found. Real-format traces: tests/step_traces.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from perftracker.agent.kineto import RankInfo, window_from_trace
from perftracker.agent.summarize.step_align import Cut, cut_window, plan_cuts, step_marks
from perftracker.agent.summarize.summarizer import SummarizeOptions, summarize_window
from perftracker.localizer.diagnose.localize import localize
from perftracker.localizer.diagnose.method.options import LocalizeOptions

from perftracker.model import Report
from perftracker.model.raw_window import RawWindow
from tests.step_traces import job_docs, strip_steps

STEPS = [1, 2, 3, 4, 5, 6]
CLEAN = {0: 4000.0, 1: 4000.0}
TAIL = {0: STEPS, 1: [*STEPS, 7]}  # rank 1 records step 7, which waits for rank 0's export
TAIL_STALL = {1: {7: 30000.0}}
HEAD = {0: [0, *STEPS], 1: STEPS}
HEAD_STALL = {0: {0: 30000.0}}


def _raw(doc: dict[str, Any], rank: int) -> RawWindow:
    return window_from_trace(doc, Path(f"rank{rank}.json"), RankInfo(rank, 2, "distributedInfo"), job="j",
                             session="offline")


def _raws(docs: dict[int, dict[str, Any]]) -> list[RawWindow]:
    return [_raw(doc, r) for r, doc in sorted(docs.items())]


def _report(raws: list[RawWindow], aligned: bool = True) -> tuple[Report, str]:
    plan = plan_cuts([step_marks(r) for r in raws])
    if aligned:
        raws = [cut_window(r, plan.by_rank[r.meta.rank]) if r.meta.rank in plan.by_rank else r for r in raws]
    sets = [summarize_window(r, None, SummarizeOptions()) for r in raws]
    return localize(sets, LocalizeOptions()), plan.note


@pytest.mark.parametrize(("steps", "stall"), [(TAIL, TAIL_STALL), (HEAD, HEAD_STALL)], ids=["tail", "head"])
def test_misaligned_clean_job_has_no_finding(steps: dict[int, list[int]], stall: dict[int, dict[int, float]]) -> None:
    raws = _raws(job_docs(steps, CLEAN, stall, seed=1))
    uncut, _ = _report(raws, aligned=False)
    assert uncut.findings, "the uncut windows read as a culprit: the case this guards"
    report, note = _report(raws)
    assert not report.findings, [f.sentence for f in report.findings]
    assert sorted(report.ranks_reported) == [0, 1]  # no rank dropped
    extra = "rank 1 step 7" if steps is TAIL else "rank 0 step 0"
    assert note == f"ranks compared over the steps all recorded (steps 1-6); cut: {extra}"


def test_aligned_clean_job_is_not_cut() -> None:
    raws = _raws(job_docs({0: STEPS, 1: STEPS}, CLEAN, seed=2))
    plan = plan_cuts([step_marks(r) for r in raws])
    assert plan.by_rank == {} and plan.note == ""
    report, _ = _report(raws)
    assert not report.findings


@pytest.mark.parametrize("slow_mm_us", [5000.0, 8000.0], ids=["1.25x", "2x"])
@pytest.mark.parametrize(("steps", "stall"), [(TAIL, TAIL_STALL), (HEAD, HEAD_STALL)], ids=["tail", "head"])
def test_slowed_rank_is_found_inside_the_common_steps(steps: dict[int, list[int]], stall: dict[int, dict[int, float]],
                                                       slow_mm_us: float) -> None:
    raws = _raws(job_docs(steps, {0: 4000.0, 1: slow_mm_us}, stall, seed=3))
    report, _ = _report(raws)
    assert len(report.findings) == 1, [f.sentence for f in report.findings]
    f = report.findings[0]
    assert f.key == "aten::mm" and f.ranks == (1,)
    # the saving is the step time rank 1's extra compute costs: counted once, not also as rank 0's wait
    step_us = 1000.0 + slow_mm_us + 150.0 + 100.0
    truth = (slow_mm_us - 4000.0) / step_us
    assert f.saves_share == pytest.approx(truth, rel=0.25), (f.saves_share, truth)


def test_below_the_bar_is_not_found() -> None:
    """The twin near the threshold: 2% more compute on rank 1, misaligned tail: no finding."""
    raws = _raws(job_docs(TAIL, {0: 4000.0, 1: 4080.0}, TAIL_STALL, seed=4))
    report, _ = _report(raws)
    assert not report.findings, [f.sentence for f in report.findings]


def test_no_common_step_cuts_nothing_and_says_so() -> None:
    raws = _raws(job_docs({0: [1, 2, 3], 1: [4, 5, 6]}, CLEAN, seed=5))
    plan = plan_cuts([step_marks(r) for r in raws])
    assert plan.by_rank == {}
    assert plan.note == ("ranks not aligned: no ProfilerStep number is recorded by every rank (rank 0 steps 1-3; "
                         "rank 1 steps 4-6); each rank's whole trace is compared")


def test_no_step_marks_one_host_cuts_to_the_common_time() -> None:
    docs = {r: strip_steps(d) for r, d in job_docs(TAIL, CLEAN, TAIL_STALL, seed=6).items()}
    raws = _raws(docs)
    plan = plan_cuts([step_marks(r) for r in raws])
    assert list(plan.by_rank) == [1]
    cut = plan.by_rank[1]
    assert cut.end_ns == raws[0].meta.window_end_ns and cut.steps == ()
    assert plan.note.startswith("ranks cut to the time all traces cover") and "rank 1 " in plan.note
    report, _ = _report(raws)
    assert not report.findings, [f.sentence for f in report.findings]


def test_no_step_marks_different_hosts_cut_nothing() -> None:
    docs = job_docs(TAIL, CLEAN, TAIL_STALL, seed=7)
    docs = {r: {**strip_steps(d), "host_name": f"node{r}"} for r, d in docs.items()}
    plan = plan_cuts([step_marks(r) for r in _raws(docs)])
    assert plan.by_rank == {}
    assert plan.note.startswith("ranks not aligned: some traces have no ProfilerStep marks and they come from different hosts")
    assert plan.usual  # the common case of multi-host traces: no warning, nothing in the report


def test_step_numbers_match_across_clock_offsets() -> None:
    """Hosts whose clocks differ by seconds: steps matched by number, each rank cut on its own clock."""
    docs = job_docs(TAIL, CLEAN, TAIL_STALL, seed=8)
    for e in docs[1]["traceEvents"]:
        e["ts"] += 7_000_000.0
    raws = _raws(docs)
    plan = plan_cuts([step_marks(r) for r in raws])
    cut = plan.by_rank[1]
    assert cut.steps == tuple(STEPS)
    assert cut.start_ns > raws[0].meta.window_end_ns  # rank 1's own clock
    report, _ = _report(raws)
    assert not report.findings


def test_many_ranks_note_stays_short() -> None:
    """64 ranks, odd ones with an extra step: the note names six and counts the rest."""
    steps = {r: [*STEPS, 7] if r % 2 else STEPS for r in range(64)}
    marks = [step_marks(r) for r in _raws({r: d for r, d in job_docs(steps, dict.fromkeys(range(64), 4000.0), seed=10).items()})]
    plan = plan_cuts(marks)
    assert sorted(plan.by_rank) == list(range(1, 64, 2))
    assert plan.note.endswith("cut: rank 1 step 7, rank 3 step 7, rank 5 step 7, rank 7 step 7, rank 9 step 7, "
                              "rank 11 step 7, ... (26 more)")


def test_cut_window_clips_rows_and_steps() -> None:
    raw = _raw(job_docs(TAIL, CLEAN, TAIL_STALL, seed=9)[1], 1)
    marks = step_marks(raw)
    assert sorted(marks.cpu) == [*STEPS, 7]
    lo, hi = marks.cpu[2][0], marks.cpu[3][1]
    mid = (lo + hi) // 2
    out = cut_window(raw, Cut(lo, mid, steps=(2,), iteration_ms=(1.5,)))
    assert out.meta.window_start_ns == lo and out.meta.window_end_ns == mid
    assert out.meta.iteration_ms == (1.5,)
    assert int(out.col("start_ns").min()) >= lo and int(out.col("end_ns").max()) <= mid
    assert len(out) < len(raw)
    names = {out.names[int(i)] for i in np.unique(out.col("name_id"))}
    assert "ProfilerStep#7" not in names and "ProfilerStep#2" in names
    # a GPU device keeps its own bounds
    cols = {k: v.copy() for k, v in raw.columns.items()}
    cols["device"][:] = np.where(np.arange(len(raw)) % 2 == 0, 0, -1).astype(cols["device"].dtype)
    gpu_raw = RawWindow(raw.meta, cols, raw.names)
    out = cut_window(gpu_raw, Cut(lo, mid, gpu={0: (lo, hi)}))
    on_gpu = out.col("device") == 0
    assert int(out.col("end_ns")[on_gpu].max()) > mid and int(out.col("end_ns")[~on_gpu].max()) <= mid
    assert out.meta.window_end_ns == hi
