"""Set operations on integer arrays (rank and column indices), by sorting: the same results as
``np.unique`` and ``np.setdiff1d``, which numpy 2.x computes through a hash table that costs about
a second per million integers (issue 45: five such calls were a third of the localizer's time at a
million workers; a sort is 20 times faster)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def unique_ints(values: np.ndarray | Sequence[int]) -> np.ndarray:
    """``np.unique(values)`` of integers: sorted, without repeats, the same dtype."""
    a = np.asarray(values).ravel()
    if a.size < 2:
        return a.copy()
    if bool(np.all(a[1:] > a[:-1])):  # already sorted and distinct (rank and column lists usually are)
        return a.copy()
    a = np.sort(a)
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def setdiff_ints(values: np.ndarray | Sequence[int], remove: np.ndarray | Sequence[int]) -> np.ndarray:
    """``np.setdiff1d(values, remove)`` of integers: the sorted unique values not in ``remove``."""
    a = unique_ints(values)
    b = np.asarray(remove)
    if a.size == 0 or b.size == 0:
        return a
    return a[~np.isin(a, b)]


def columns_of(ranks: np.ndarray, wanted: np.ndarray | Sequence[int]) -> np.ndarray:
    """The columns of ``wanted``'s ranks in ``ranks`` (distinct ints), in ``wanted``'s order, those
    not in ``ranks`` left out: ``[column[r] for r in wanted if r in column]`` with ``column`` the
    rank -> column dict, without building a dict of a million ranks. int64."""
    w = np.asarray(wanted, dtype=np.int64).ravel()
    r = np.asarray(ranks, dtype=np.int64)
    if w.size == 0 or r.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(r, kind="stable")
    sorted_ranks = r[order]
    pos = np.minimum(np.searchsorted(sorted_ranks, w), r.size - 1)
    out: np.ndarray = order[pos[sorted_ranks[pos] == w]].astype(np.int64, copy=False)
    return out
