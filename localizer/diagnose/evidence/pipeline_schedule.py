"""A pipeline pair's wait that its schedule makes, not a late rank (issue 31). Pure.

In a pipeline every stage waits for its neighbour by design: with one micro-batch in flight, stage
1 waits at its recv for stage 0's forward and stage 0 for stage 1's forward and backward, every
step, in every data-parallel replica. The wait evidence (``waits.late_workers``) judges each
process group on its own, so a two-rank pipeline group always has a "late" member, the stage that
computes longer, and when that wait passes ``wait_min`` the rank was named: on the DP2 × PP2 gloo job
(tests/framework_jobs/pp_dp_gloo.py) with rank 2 slowed, "rank 0: aten::mm 5.1% against 3.8% on the
ranks that wait for it ... rank 1 waits for it 12% in recv" beside the right headline: rank 1's
12% was the bubble that rank 3 shows too (on top of its 47% wait for the slowed rank 2).

**[decision] Like with like (issue 28's rule for compute, here for waits).** A late group of a
pipeline group (its late ranks all of one stage, its waiting ranks all of another) is the
schedule's when its wait exceeds, by less than ``wait_min``, the same wait in its *like* groups:
the other groups of the same collective family whose members are of the same stages (the same pipeline
position in the other data-parallel replicas), measured the same way round (the median β of the
waiting stage's members minus that of the late stage's). The like groups' wait is their median;
the group itself is left out (with two replicas, a slowed replica would otherwise set half of its
own bar). Without like groups (one pipeline, no replica; traces without process groups) nothing
changes: a heavy stage of one rank per stage is that rank.

What it cannot tell: a pair late by the same amount in every replica (a heavy stage) is not a rank's
fault; ``group_findings`` names it as a stage where the compute says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from perftracker.localizer.diagnose.evidence.waits import (
    LateGroup,
    MemberSets,
    WaitOptions,
    family_shares,
)


def schedule_waits(values_beta: np.ndarray, families: list[list[int]], stage: np.ndarray | None,
                   member_sets: MemberSets | None, groups: Sequence[LateGroup], opts: WaitOptions) -> list[bool]:
    """Per late group: whether its wait is its pipeline schedule's (see the module doc)."""
    if stage is None or not member_sets:
        return [False] * len(groups)
    by_family: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
    for f, cols, b, g in family_shares(values_beta, families, stage, member_sets):
        if g >= 0:
            by_family.setdefault(f, []).append((g, cols, b))
    return [_within_like(lg, stage, by_family.get(lg.f, []), opts) for lg in groups]


def _within_like(lg: LateGroup, stage: np.ndarray, like: list[tuple[int, np.ndarray, np.ndarray]],
                 opts: WaitOptions) -> bool:
    if lg.group < 0:
        return False
    late_st, wait_st = np.unique(stage[lg.late]), np.unique(stage[lg.waiting])
    if late_st.size != 1 or wait_st.size != 1 or late_st[0] < 0 or wait_st[0] < 0 or late_st[0] == wait_st[0]:
        return False
    signature = sorted(stage[np.r_[lg.late, lg.waiting]].tolist())
    shares = []
    for g, cols, b in like:
        if g == lg.group or sorted(stage[cols].tolist()) != signature:
            continue
        on_wait, on_late = b[stage[cols] == wait_st[0]], b[stage[cols] == late_st[0]]
        shares.append(float(np.median(on_wait)) - float(np.median(on_late)))
    if not shares:
        return False
    return lg.wait_share - float(np.median(shares)) < opts.wait_min
