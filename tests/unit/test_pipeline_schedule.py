"""A pipeline pair's wait that its schedule makes is no rank's (issue 31, the DP2 x PP2 gloo job):
each stage-1 rank waits at its recv for its stage-0 partner's forward every step, in every replica.
Pure logic on hand-built DP2 x PP2 pattern sets (rank r = 2d + s), each case with its twin."""

from __future__ import annotations

import numpy as np
import pytest
from dp_pp_sets import dp_pp_set
from perftracker.localizer.diagnose.evidence.pipeline_schedule import schedule_waits
from perftracker.localizer.diagnose.evidence.waits import LateGroup, WaitOptions
from perftracker.localizer.diagnose.localize import localize

from perftracker.model import PatternSet

OPTS = WaitOptions()
BUBBLE = 0.12  # a stage-1 rank waits this share of the window at its recv for stage 0's forward


def _job(slow: int | None, bubble1: float = BUBBLE, rng_seed: int = 0) -> list[PatternSet]:
    """DP2 x PP2: stage 0 computes a little more than stage 1 (0.23 vs 0.20, below the stage
    imbalance ratio); ``slow`` computes 2x and its pipeline partner and data-parallel peer wait for
    it, the fourth rank one hop further. ``bubble1``: replica 0's stage-1 wait at its recv."""
    rng = np.random.default_rng(rng_seed)
    sets = []
    for r in range(4):
        d, s = divmod(r, 2)
        gemm = (0.23 if s == 0 else 0.20) * (2.0 if r == slow else 1.0)
        sendrecv = 0.02 if s == 0 else (bubble1 if d == 0 else BUBBLE)
        allreduce = 0.02
        if slow is not None and r != slow:
            sd, ss = divmod(slow, 2)
            if d == sd:
                sendrecv += 0.35 if s != ss else 0.0  # its pipeline partner waits for it
            elif s == ss:
                allreduce = 0.29  # its data-parallel peer waits for it
            else:
                allreduce = 0.27  # the partner's peer waits for the partner, one hop further
        jitter = 1 + 0.01 * rng.standard_normal(3)
        sets.append(dp_pp_set(r, 4, gemm * jitter[0], sendrecv * jitter[1], allreduce * jitter[2]))
    return sets


def _rank_findings(report) -> list[str]:  # type: ignore[no-untyped-def]
    return [f"{f.ranks} {f.sentence}" for f in report.findings if len(f.ranks) < 4]


@pytest.mark.parametrize("slow", [2, 0])
def test_the_slowed_rank_is_named_and_the_other_pipeline_bubble_is_no_ones(slow: int) -> None:
    report = localize(_job(slow))
    head = report.findings[0]
    assert head.ranks == (slow,) and head.key == "gemm", _rank_findings(report)
    assert {r for w in head.waits for r in w.ranks} == {0, 1, 2, 3} - {slow}, head.sentence
    # the other replica's stage-0 rank, late at its pipeline pair only by the schedule's bubble
    other = 2 - slow
    assert not [f for f in report.findings if other in f.ranks and len(f.ranks) < 4], _rank_findings(report)


def test_a_clean_pipeline_with_its_bubbles_names_no_rank() -> None:
    for seed in range(3):
        report = localize(_job(None, rng_seed=seed))
        assert not _rank_findings(report), _rank_findings(report)


def _pair_groups(sets: list[PatternSet]) -> tuple[np.ndarray, list[list[int]], np.ndarray, dict, list[LateGroup]]:  # type: ignore[type-arg]
    """The send/recv β of the two pipeline pairs as schedule_waits reads them: families [[0]],
    pairs pp0 = columns (0, 1) and pp1 = (2, 3), stage = column % 2; each pair's late group
    (stage 0 late, stage 1 waiting) with its wait."""
    b = np.array([[s.patterns[1].beta for s in sets]])
    sets_of = {0: [(0, np.array([0, 1])), (1, np.array([2, 3]))]}
    groups = [LateGroup(0, np.array([2 * d]), np.array([2 * d + 1]), float(b[0, 2 * d + 1] - b[0, 2 * d]), d)
              for d in range(2)]
    return b, [[0]], np.arange(4) % 2, sets_of, groups


@pytest.mark.parametrize(("over", "schedule"), [(0.9, True), (1.1, False), (3.0, False)])
def test_a_pair_is_late_on_its_own_only_beyond_its_like_pair_by_wait_min(over: float, schedule: bool) -> None:
    b, fams, stage, sets_of, groups = _pair_groups(_job(None, bubble1=BUBBLE + over * OPTS.wait_min))
    got = schedule_waits(b, fams, stage, sets_of, groups, OPTS)
    assert got[0] is schedule
    assert got[1] is True  # replica 1's pair, below replica 0's: its bubble


def test_without_a_like_pair_nothing_changes() -> None:
    """One pipeline (no replica), or no stages: a two-rank pipeline's wait is judged as before."""
    b, fams, stage, sets_of, groups = _pair_groups(_job(None))
    one = {0: [sets_of[0][0]]}
    assert schedule_waits(b, fams, stage, one, groups[:1], OPTS) == [False]
    assert schedule_waits(b, fams, None, sets_of, groups, OPTS) == [False, False]
