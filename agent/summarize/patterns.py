"""Behavior patterns: Algorithm 1 (critical execution duration) and (β, μ, σ) per function.

docs/design.md section 5, exactly:
- β_f = Σ_e c_e / T, with c_e an execution's nanoseconds on the critical path;
- μ_f = Σ_e d'_e·u_e / Σ_e d'_e and σ_f = Σ_e d'_e·s_e / Σ_e d'_e, where d'_e is the critical
  execution duration (Algorithm 1) over the utilization samples inside execution e, u_e their mean
  and s_e their (population) standard deviation;
- an execution without a nonzero sample has d'_e = 0 and adds nothing; a function whose executions
  all have d'_e = 0 gets μ = σ = 0.

A sample i covers (t_{i-1}, t_i] (``UtilSeries``); it is *inside* an execution when that interval
lies within one of the execution's self-time segments. A sample that straddles an edge measures
the neighbour as much as the execution, so it is left out: a function that sleeps gets μ = 0, not
the utilization of whatever ran just before or after it. d'_e = (samples in the run) × period.

**[decision] Executions shorter than a sampling period.** Most CPU ops last microseconds, far below
a 1 kHz sampler's period, so no sample lies inside them. Leaving them out is not neutral: the only
executions of a short op that do contain a whole sample are the ones the scheduler stretched (the
thread was preempted mid-op for a millisecond or more), and those samples read about 0. μ of a short
op then measured how often it was descheduled (it read 0.03-0.1 for aten ops on a busy host) and
swung from rank to rank with scheduling luck. So an execution with no sample inside takes the
samples its self segments shorter than one period overlap, each weighted by the overlap (ns): u_e
and s_e are their weighted mean and standard deviation, and d'_e is the overlapped time when u_e > 0
(0 otherwise, as Algorithm 1 gives an all-zero execution). That is the sampler's unbiased estimate
at its resolution: summed over a function's many executions it is the thread's utilization while the
function ran. Executions that do contain samples keep the rule above, so a sleep still reads 0, and
longer segments without a whole sample (1-2 periods) still add nothing: a sleep of that length would
mostly read its neighbours' CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perftracker.model.raw_window import UtilSeries

DEFAULT_MAX_ZERO_RUN = 3  # c, in samples; see docs/decisions.md


@dataclass(frozen=True)
class RunStats:
    """Per group: samples in the critical run (0 if none), mean and std over the run."""

    n_samples: np.ndarray
    mean: np.ndarray
    std: np.ndarray


def critical_runs(values: np.ndarray, group: np.ndarray, n_groups: int, max_zero_run: int) -> RunStats:
    """Algorithm 1 for many executions at once.

    ``values`` are the samples of all executions concatenated, ``group`` (non-decreasing) the
    execution index of each sample. For each group: the longest run [i, j] with u_i > 0, u_j > 0 and
    at most ``max_zero_run`` consecutive zeros inside (ties: the earliest).
    """
    n_samples = np.zeros(n_groups, dtype=np.int64)
    mean = np.zeros(n_groups, dtype=np.float64)
    std = np.zeros(n_groups, dtype=np.float64)
    n = len(values)
    if n == 0:
        return RunStats(n_samples, mean, std)
    u = np.asarray(values, dtype=np.float64)
    g = np.asarray(group, dtype=np.int64)
    new_group = np.r_[True, g[1:] != g[:-1]]
    zero = ~(u > 0)
    # zero runs, split at group boundaries; a run longer than c breaks the execution
    run_start = zero & (new_group | np.r_[True, ~zero[:-1]])
    run_id = np.cumsum(run_start) - 1
    run_len = np.bincount(run_id[zero], minlength=int(run_id[-1]) + 1 if run_start.any() else 0)
    breaker = np.zeros(n, dtype=bool)
    if run_start.any():
        breaker[zero] = run_len[run_id[zero]] > max_zero_run
    piece_start = ~breaker & (new_group | np.r_[True, breaker[:-1]])
    piece_id = np.cumsum(piece_start) - 1
    nz = np.flatnonzero(~zero)
    if len(nz) == 0:
        return RunStats(n_samples, mean, std)
    pid = piece_id[nz]
    _, first_pos = np.unique(pid, return_index=True)
    _, last_pos_rev = np.unique(pid[::-1], return_index=True)
    first = nz[first_pos]
    last = nz[len(nz) - 1 - last_pos_rev]
    length = last - first + 1
    pg = g[first]
    # per group: longest piece, earliest on ties
    order = np.lexsort((first, -length, pg))
    best = order[np.r_[True, pg[order][1:] != pg[order][:-1]]]
    c1 = np.r_[0.0, np.cumsum(u)]
    c2 = np.r_[0.0, np.cumsum(u * u)]
    f, la = first[best], last[best] + 1
    cnt = (la - f).astype(np.float64)
    m = (c1[la] - c1[f]) / cnt
    var = np.maximum((c2[la] - c2[f]) / cnt - m * m, 0.0)
    grp = pg[best]
    n_samples[grp] = la - f
    mean[grp] = m
    std[grp] = np.sqrt(var)
    return RunStats(n_samples, mean, std)


def _sample_starts(t: np.ndarray, period_ns: int) -> np.ndarray:
    """t_{i-1} for each sample i: sample i covers (t_{i-1}, t_i]; the first covers one period."""
    starts: np.ndarray = np.r_[t[0] - max(int(period_ns), 1), t[:-1]]
    return starts


def samples_inside(owner: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray, series: UtilSeries
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(execution, sample index) pairs, unique and sorted by execution then time.

    ``owner``/``start_ns``/``end_ns`` are self-time segments; a sample is inside when its interval
    (t_{i-1}, t_i] lies within a segment of the execution.
    """
    t = np.asarray(series.t_ns, dtype=np.int64)
    if len(t) == 0 or len(owner) == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z
    t_prev = _sample_starts(t, series.period_ns)
    lo = np.searchsorted(t_prev, start_ns, side="left")
    hi = np.searchsorted(t, end_ns, side="right")
    cnt = np.maximum(hi - lo, 0)
    total = int(cnt.sum())
    if total == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z
    rep_owner = np.repeat(owner.astype(np.int64), cnt)
    offsets = np.cumsum(cnt) - cnt
    idx = np.arange(total, dtype=np.int64) - np.repeat(offsets - lo, cnt)
    key = np.unique(rep_owner * (len(t) + 1) + idx)
    return key // (len(t) + 1), key % (len(t) + 1)


@dataclass(frozen=True)
class Utilization:
    mu: np.ndarray  # per function
    sigma: np.ndarray


def utilization(func_of_event: np.ndarray, n_funcs: int, seg_owner: np.ndarray, seg_start_ns: np.ndarray,
                seg_end_ns: np.ndarray, series: UtilSeries, max_zero_run: int) -> Utilization:
    """μ and σ per function over its executions' critical execution durations."""
    mu = np.zeros(n_funcs, dtype=np.float64)
    sigma = np.zeros(n_funcs, dtype=np.float64)
    w = np.zeros(n_funcs, dtype=np.float64)
    wu = np.zeros(n_funcs, dtype=np.float64)
    ws = np.zeros(n_funcs, dtype=np.float64)
    ex, si = samples_inside(seg_owner, seg_start_ns, seg_end_ns, series)
    uniq_ex = np.zeros(0, dtype=np.int64)
    if len(ex):
        uniq_ex, group = np.unique(ex, return_inverse=True)
        values = np.clip(np.asarray(series.value, dtype=np.float64)[si], 0.0, 1.0)
        runs = critical_runs(values, group.reshape(-1), len(uniq_ex), max_zero_run)
        d = runs.n_samples.astype(np.float64) * max(int(series.period_ns), 1)  # d'_e
        _accumulate(w, wu, ws, func_of_event[uniq_ex], d, runs.mean, runs.std)
    # self segments shorter than one period, of executions with no sample inside (see the module doc)
    period = max(int(series.period_ns), 1)
    short = ~np.isin(seg_owner, uniq_ex) & ((np.asarray(seg_end_ns) - np.asarray(seg_start_ns)) < period)
    if short.any():
        ex2, d2, m2, s2 = overlap_stats(seg_owner[short], seg_start_ns[short], seg_end_ns[short], series)
        _accumulate(w, wu, ws, func_of_event[ex2], np.where(m2 > 0, d2, 0.0), m2, s2)
    has = w > 0
    mu[has] = np.clip(wu[has] / w[has], 0.0, 1.0)
    sigma[has] = np.clip(ws[has] / w[has], 0.0, 1.0)
    return Utilization(mu, sigma)


def _accumulate(w: np.ndarray, wu: np.ndarray, ws: np.ndarray, f: np.ndarray, d: np.ndarray, mean: np.ndarray,
                std: np.ndarray) -> None:
    """Add executions (function f, weight d'_e, u_e, s_e) to the per-function weighted sums."""
    ok = f >= 0
    n = len(w)
    w += np.bincount(f[ok], weights=d[ok], minlength=n)
    wu += np.bincount(f[ok], weights=(d * mean)[ok], minlength=n)
    ws += np.bincount(f[ok], weights=(d * std)[ok], minlength=n)


def overlap_stats(owner: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray, series: UtilSeries
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per execution (segments grouped by ``owner``): the samples its segments overlap, weighted by
    the overlap. Returns (execution, overlapped ns, weighted mean, weighted std), one row per
    execution that overlaps any sample (see the module doc: executions shorter than a period)."""
    t = np.asarray(series.t_ns, dtype=np.int64)
    z = np.zeros(0, dtype=np.int64)
    zf = np.zeros(0, dtype=np.float64)
    if len(t) == 0 or len(owner) == 0:
        return z, zf, zf, zf
    t_prev = _sample_starts(t, series.period_ns)
    start = np.asarray(start_ns, dtype=np.int64)
    end = np.asarray(end_ns, dtype=np.int64)
    first = np.searchsorted(t, start, side="right")  # first sample ending after the segment starts
    last = np.searchsorted(t_prev, end, side="left")  # one past the last sample starting before it ends
    cnt = np.maximum(last - first, 0)
    total = int(cnt.sum())
    if total == 0:
        return z, zf, zf, zf
    seg = np.repeat(np.arange(len(start)), cnt)
    idx = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(first, cnt)
    ov = (np.minimum(t[idx], end[seg]) - np.maximum(t_prev[idx], start[seg])).astype(np.float64)
    keep = ov > 0
    seg, idx, ov = seg[keep], idx[keep], ov[keep]
    if len(ov) == 0:
        return z, zf, zf, zf
    u = np.clip(np.asarray(series.value, dtype=np.float64)[idx], 0.0, 1.0)
    ex, inv = np.unique(np.asarray(owner, dtype=np.int64)[seg], return_inverse=True)
    inv = inv.reshape(-1)
    wsum = np.bincount(inv, weights=ov, minlength=len(ex))
    mean = np.bincount(inv, weights=ov * u, minlength=len(ex)) / wsum
    var = np.maximum(np.bincount(inv, weights=ov * u * u, minlength=len(ex)) / wsum - mean * mean, 0.0)
    return ex, wsum, mean, np.sqrt(var)
