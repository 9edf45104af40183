"""Waits between the same two ranks in two process groups, and one late set per group (issue 28).

On a two-stage pipeline a replica's send/recv and its embedding all-reduce join the same pair of
ranks. A stage-0 rank that computes slower is late at the send/recv (its stage-1 partner waits for
it) while it waits at the embedding all-reduce for that partner, as every stage-0 rank does for the
heavier stage. The two are phases of one step between the same ranks, not a chain: following them
made a cycle that handed the slowed rank's waits to the heavy stage and left its partner, late one
hop further at the stage-1 all-reduce, as a culprit of its own. Hand-built pattern sets (window
shares as on the real DP32 x PP2 traces with ranks 4 and 6 slowed); each case has a twin."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.localizer.diagnose.evidence.waits import LateGroup, wait_roots
from perftracker.localizer.diagnose.localize import localize
from perftracker.localizer.diagnose.verdict.findings import _one_late_set_per_group

from perftracker.model import Category, Pattern, PatternSet, ProcessGroup

N_DP = 8
N = 2 * N_DP


def _set(r: int, gemm: float, sendrecv: float, emb: float, allreduce: float) -> PatternSet:
    d, s = divmod(r, 2)
    pair = (2 * d, 2 * d + 1)
    groups = (ProcessGroup(f"pp{d}", "PIPELINE_MODEL_PARALLEL_GROUP", pair, True),
              ProcessGroup(f"emb{d}", "EMBEDDING_GROUP", pair, True),
              ProcessGroup(f"dp{s}", "DATA_PARALLEL_GROUP", tuple(range(s, N, 2))))
    pats = (Pattern("gemm", Category.COMPUTE, gemm, 0.0, 0.0, "gemm"),
            Pattern("nccl:send_recv", Category.COLLECTIVE, sendrecv, 0.0, 0.0, "nccl:send_recv"),
            Pattern("nccl:all_reduce [EMBEDDING_GROUP]", Category.COLLECTIVE, emb, 0.0, 0.0,
                    "nccl:all_reduce [EMBEDDING_GROUP]"),
            Pattern("nccl:all_reduce [DATA_PARALLEL_GROUP]", Category.COLLECTIVE, allreduce, 0.0, 0.0,
                    "nccl:all_reduce [DATA_PARALLEL_GROUP]"))
    return PatternSet("j", "s", r, N, f"h{r}", 0, 10**9, pats, source="kineto", gpu=True, groups=groups,
                      comm={"nccl:send_recv": (f"pp{d}",), "nccl:all_reduce [EMBEDDING_GROUP]": (f"emb{d}",),
                            "nccl:all_reduce [DATA_PARALLEL_GROUP]": (f"dp{s}",)})


def _job(slowed: tuple[int, ...], slow: float, idler: bool = False) -> list[PatternSet]:
    """Stage 1 computes 1.8x stage 0; stage 0 waits for it at the send/recv (0.23) and the embedding
    all-reduce (0.14). Each slowed stage-0 rank computes 2 x ``slow`` more: it waits ``slow`` less at
    its send/recv (its partner waits that long for it there instead, and is late by it at the stage-1
    all-reduce, where its stage-1 peers wait), and its data-parallel peers wait ``slow`` for it. Every
    rank's shares sum to 0.8 + ``slow`` of the window. ``idler``: rank 0 idles ``slow / 2`` before the
    data-parallel all-reduce on its own (as the real traces' rank 0 does) and waits that much less there:
    still before the slowed ranks arrive, so no one waits for it."""
    rng = np.random.default_rng(28)
    partners = {r + 1 for r in slowed}
    sets = []
    for r in range(N):
        s = r % 2
        j = 1.0 + 0.01 * float(rng.standard_normal())
        if s == 0:
            gemm, sr, emb, ar = 0.4 * j, 0.23, 0.14, 0.03 + slow
            if r in slowed:
                gemm, sr, ar = gemm + 2 * slow, sr - slow, 0.03
            elif r == 0 and idler:
                ar -= slow / 2
        else:
            gemm, sr, emb, ar = 0.73 * j, 0.03, 0.01, 0.03 + slow
            if r in partners:
                sr, ar = sr + slow, 0.03
        sets.append(_set(r, gemm, sr, emb, ar))
    return sets


def _rank_findings(report: object) -> list[tuple[str, tuple[int, ...]]]:
    return [(f.key, f.ranks) for f in report.findings if len(f.ranks) < N // 2]  # type: ignore[attr-defined]


@pytest.mark.parametrize("idler", [False, True])
@pytest.mark.parametrize("slowed", [(4,), (4, 6)])
@pytest.mark.parametrize("slow", [0.15, 0.2])
def test_a_slowed_stage0_rank_owns_its_partner_s_wait_and_the_hop_beyond(slowed: tuple[int, ...], slow: float,
                                                                          idler: bool) -> None:
    # from slow = 0.10 on the slowed rank holds the send/recv less than its partner (0.23 - slow against
    # 0.03 + slow): the pair's late member is the slowed rank. Near that flip (0.12) the pair's p2p waits
    # (both directions in one β) still leave the partner's own findings: not pinned here
    report = localize(_job(slowed, slow, idler))
    named = _rank_findings(report)
    assert named == [("gemm", slowed)], named  # no finding on a partner or on the partners' collective
    waits = {r for w in report.findings[[f.ranks for f in report.findings].index(slowed)].waits for r in w.ranks}
    partners = {r + 1 for r in slowed}
    assert partners <= waits  # the partners wait for it at the send/recv
    assert set(range(1, N, 2)) - partners <= waits  # and their stage-1 peers one hop further
    stage = [f for f in report.findings if f.key == "pipeline stage imbalance"]
    assert stage and not partners & {r for w in stage[0].waits for r in w.ranks if "send" in w.function}


def test_no_slowed_rank_names_the_stage_only() -> None:
    report = localize(_job((4,), 0.0))
    assert _rank_findings(report) == [], _rank_findings(report)
    assert any(f.key == "pipeline stage imbalance" for f in report.findings)


# --- wait_roots: the same ranks in two groups ----------------------------------------------------------

def _lg(f: int, late: list[int], waiting: list[int], group: int, share: float) -> LateGroup:
    return LateGroup(f, np.array(late), np.array(waiting), share, group)


def test_two_groups_of_the_same_pair_are_not_a_chain() -> None:
    p2p = _lg(0, [4], [5], 7, 0.11)  # 5 waits for 4 at the send/recv
    emb = _lg(1, [5], [4], 8, 0.12)  # 4 waits for 5 at the embedding all-reduce: same pair
    dp1 = _lg(2, [5], [1, 3, 7], 4, 0.15)  # 5 late at the stage-1 all-reduce
    _, roots = wait_roots([p2p, emb, dp1])
    assert roots == [0, 1, 0]  # each pair group its own root; the stage-1 wait goes to rank 4


def test_a_group_of_other_ranks_is_still_followed() -> None:
    # the twin: the all-reduce rank 4 waits in joins a third rank: a wait elsewhere, followed
    p2p = _lg(0, [4], [5], 7, 0.11)
    other = _lg(1, [5], [4, 9], 8, 0.12)
    _, roots = wait_roots([p2p, other])
    assert roots[0] == 1


# --- one late set per collective and process group -------------------------------------------------------

def test_late_groups_of_one_process_group_are_one_set() -> None:
    a = _lg(3, [10], [0, 2, 4, 6], 1, 0.41)  # the per-step compute found rank 10
    b = _lg(3, [0], [2, 4, 6], 1, 0.10)  # an early exit found rank 0, in the same group
    out = _one_late_set_per_group([a, b])
    assert len(out) == 1
    assert out[0].late.tolist() == [0, 10] and out[0].waiting.tolist() == [2, 4, 6]
    assert out[0].wait_share == 0.41 and out[0].group == 1


def test_other_groups_functions_and_stage_groups_stay_apart() -> None:
    a = _lg(3, [10], [0, 2], 1, 0.41)
    groups = [a, _lg(3, [1], [3, 5], 4, 0.1), _lg(2, [0], [2, 4], 1, 0.1),
              _lg(3, [0], [2, 4], -1, 0.1), _lg(3, [2], [4, 6], -1, 0.1)]
    assert _one_late_set_per_group(groups) == groups


# --- a pipeline pair judged against each rank's own stage ---------------------------------------------

def _pair_job(slow_sr: float, partner_sr: float) -> tuple[np.ndarray, np.ndarray]:
    """(β of one send/recv family over 8 ranks, stages): stage 0 holds it 0.265, stage 1 0.034
    (stage 0 waits for the heavy stage); ranks 4 and 5 are one pair."""
    b = np.array([0.265, 0.034] * 4)
    b[4], b[5] = slow_sr, partner_sr
    return b[None, :], np.array([0, 1] * 4)


@pytest.mark.parametrize("partner, late", [(0.089, True), (0.034 + 0.055, True), (0.034 + 0.045, False),
                                          (0.034, False)])
def test_a_pair_across_stages_is_judged_against_each_stage(partner: float, late: bool) -> None:
    from perftracker.localizer.diagnose.evidence.waits import WaitOptions, pair_across_stages

    beta, stage = _pair_job(0.138, partner)  # rank 4 holds it 0.138 (its stage: 0.265): it arrives late
    cols = np.array([4, 5])
    mask, share = pair_across_stages(beta, [[0]], stage, 0, cols, beta[0, cols], WaitOptions())
    assert bool(mask.any()) is late  # its partner waits partner - 0.034 more than its stage: material from 0.05
    if late:
        assert mask.tolist() == [True, False] and abs(share - (partner - 0.034)) < 1e-9


def test_a_pair_of_one_stage_or_a_partner_below_its_stage_is_not_judged_so() -> None:
    from perftracker.localizer.diagnose.evidence.waits import WaitOptions, pair_across_stages

    beta, _ = _pair_job(0.138, 0.2)
    one_stage = np.zeros(8, dtype=np.int64)
    cols = np.array([4, 5])
    assert not pair_across_stages(beta, [[0]], one_stage, 0, cols, beta[0, cols], WaitOptions())[0].any()
    beta2, stage = _pair_job(0.3, 0.2)  # rank 4 above its stage's median: it is not late
    assert not pair_across_stages(beta2, [[0]], stage, 0, cols, beta2[0, cols], WaitOptions())[0].any()
