"""The critical path: a sweep over sorted segment boundaries, in numpy.

Input: disjoint-per-owner *segments* (an event's self time) each with a priority level
(0 compute, 1 memory, 2 collective, 3 python). A moment belongs to the critical path of the
highest-priority level active at that moment (docs/design.md section 5). When several segments of that
level are active at once (two kernels on two streams, compute ops on two threads), they share the
moment equally, so that the critical shares of a window never sum past its length.
"""

from __future__ import annotations

import numpy as np
from perftracker.agent.summarize.categories import N_LEVELS


def critical_ns(start_ns: np.ndarray, end_ns: np.ndarray, level: np.ndarray,
                window_start_ns: int, window_end_ns: int, n_levels: int = N_LEVELS) -> np.ndarray:
    """Nanoseconds each segment spends on the critical path (float64, one per segment)."""
    n = len(start_ns)
    out = np.zeros(n, dtype=np.float64)
    if n == 0 or window_end_ns <= window_start_ns:
        return out
    s = np.clip(start_ns, window_start_ns, window_end_ns).astype(np.int64)
    e = np.clip(end_ns, window_start_ns, window_end_ns).astype(np.int64)
    valid = (e > s) & (level >= 0) & (level < n_levels)
    bounds = np.sort(np.concatenate([s[valid], e[valid]]))
    bounds = bounds[np.r_[True, bounds[1:] != bounds[:-1]]]  # sort-based unique: faster than np.unique's hash
    if len(bounds) < 2:
        return out
    lengths = np.diff(bounds).astype(np.float64)  # elementary intervals between boundaries
    i0 = np.searchsorted(bounds, s)
    i1 = np.searchsorted(bounds, e)
    m = len(lengths)
    lv = level[valid].astype(np.int64)
    size = n_levels * (m + 1)
    counts = (np.bincount(lv * (m + 1) + i0[valid], minlength=size)
              - np.bincount(lv * (m + 1) + i1[valid], minlength=size)).reshape(n_levels, m + 1)
    active = np.cumsum(counts, axis=1)[:, :m]
    present = active > 0
    winner = np.where(present.any(axis=0), np.argmax(present, axis=0), -1)
    prefix = np.zeros((n_levels, m + 1), dtype=np.float64)
    for lvl in range(n_levels):
        share = np.where(winner == lvl, lengths / np.maximum(active[lvl], 1), 0.0)
        prefix[lvl, 1:] = np.cumsum(share)
    idx = np.flatnonzero(valid)
    out[idx] = prefix[lv, i1[valid]] - prefix[lv, i0[valid]]
    return out
