"""What a finding's shares count (issue 44): its waits without its own ranks, and its impact as a
share of one rank's window that cannot pass 100%. Pure.

A wait is a share of the waiting ranks' window (``Wait.share``: the median waiting rank's). Waits
of different ranks are the same lost time seen from each of them, so they are never added across
ranks: a rank's waits at different collectives are different intervals of its own window and add
up, those of different ranks do not. The impact is the most that any one rank loses to the cause:
the culprit's own excess on the critical path, or the longest total wait of one waiting rank,
whichever is larger, at most the whole window. (The sum of every wait over every rank read "impact:
189% of the window" on a DP4 x PP4 job with one slowed worker.)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from perftracker.model import Wait

_MANY = 4096  # rank lists longer than this go through numpy


def without_culprits(waits: Sequence[Wait], culprits: Collection[int]) -> tuple[Wait, ...]:
    """The waits less the culprit's own ranks (a culprit that waits at a collective waits for a
    rank it holds up itself, one hop further: it is not its own waiter); a wait left with no rank
    is dropped."""
    mine = set(culprits)
    out = []
    for w in waits:
        if len(w.ranks) > _MANY and mine:  # a million waiting ranks: numpy (issue 45), the same ranks
            kept = np.asarray(w.ranks, dtype=np.int64)
            ranks = tuple(kept[~np.isin(kept, np.fromiter(mine, dtype=np.int64, count=len(mine)))].tolist())
        else:
            ranks = tuple(r for r in w.ranks if r not in mine)
        if ranks:
            out.append(w if len(ranks) == len(w.ranks) else Wait(w.function, ranks, w.share))
    return tuple(out)


def per_rank_wait(waits: Sequence[Wait]) -> float:
    """The longest total wait of one waiting rank, as a share of its window (at most 1)."""
    if sum(len(w.ranks) for w in waits) > _MANY:
        return _per_rank_wait_many(waits)
    total: dict[int, float] = {}
    for w in waits:
        for r in w.ranks:
            total[r] = total.get(r, 0.0) + max(0.0, w.share)
    return min(1.0, max(total.values(), default=0.0))


def largest_wait_impact(own: float, waits: Sequence[Wait]) -> float:
    """A set of ranks' cause (a heavy stage, a moving straggler): its cost or its largest single
    wait, at most 1. Its waits one hop further (a stage-0 rank behind its pipeline partner, then its
    data-parallel peers behind it) are the same lost time passed on, so they are not added on one
    rank (added, the DP32 x PP2 stage read 44% and led a three-rank culprit that saves 38%)."""
    return min(1.0, max(0.0, own, max((w.share for w in waits), default=0.0)))


def _per_rank_wait_many(waits: Sequence[Wait]) -> float:
    """``per_rank_wait`` in numpy: each rank's shares summed in the same order (``np.bincount``
    adds its weights one by one, in input order, as the loop does), so the same floats."""
    ranks = np.concatenate([np.asarray(w.ranks, dtype=np.int64) for w in waits])
    shares = np.concatenate([np.full(len(w.ranks), max(0.0, w.share)) for w in waits])
    order = np.argsort(ranks, kind="stable")
    sorted_ranks = ranks[order]
    first = np.empty(ranks.size, dtype=bool)
    first[0] = True
    np.not_equal(sorted_ranks[1:], sorted_ranks[:-1], out=first[1:])
    group = np.empty(ranks.size, dtype=np.int64)
    group[order] = np.cumsum(first) - 1  # each entry's rank, as a dense id
    return min(1.0, float(np.bincount(group, weights=shares).max()))


def bounded_impact(own: float, waits: Sequence[Wait]) -> float:
    """The most one rank loses to the cause, as a share of the window: the culprit's own excess or
    one waiting rank's total wait, at most 1."""
    return min(1.0, max(0.0, own, per_rank_wait(waits)))
