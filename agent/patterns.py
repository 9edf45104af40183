"""Behavior patterns: Algorithm 1 (critical execution duration) and (β, μ, σ) per function.

DESIGN.md section 5, exactly:
- β_f = Σ_e c_e / T, with c_e an execution's nanoseconds on the critical path;
- μ_f = Σ_e d'_e·u_e / Σ_e d'_e and σ_f = Σ_e d'_e·s_e / Σ_e d'_e, where d'_e is the critical
  execution duration (Algorithm 1) over the utilization samples inside execution e, u_e their mean
  and s_e their (population) standard deviation;
- an execution without a nonzero sample has d'_e = 0 and adds nothing; a function whose executions
  all have d'_e = 0 gets μ = σ = 0.

A sample i covers (t_{i-1}, t_i] (``UtilSeries``); it is *inside* an execution when that interval
lies within one of the execution's self-time segments. A sample that straddles an edge measures
the neighbour as much as the execution, so it is left out: a function that sleeps gets μ = 0, not
the utilization of whatever ran just before or after it. Executions shorter than a sampling
period get no sample (d'_e = 0), which is all a sampler of that period can say about them.
d'_e = (samples in the run) × period.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perftracker.rawdata import UtilSeries

DEFAULT_MAX_ZERO_RUN = 3  # c, in samples; see README "decisions"


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
    t_prev = np.r_[t[0] - max(int(series.period_ns), 1), t[:-1]]
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
    ex, si = samples_inside(seg_owner, seg_start_ns, seg_end_ns, series)
    if len(ex) == 0:
        return Utilization(mu, sigma)
    uniq_ex, group = np.unique(ex, return_inverse=True)
    values = np.clip(np.asarray(series.value, dtype=np.float64)[si], 0.0, 1.0)
    runs = critical_runs(values, group.reshape(-1), len(uniq_ex), max_zero_run)
    d = runs.n_samples.astype(np.float64) * max(int(series.period_ns), 1)  # d'_e
    f = func_of_event[uniq_ex]
    ok = f >= 0
    w = np.bincount(f[ok], weights=d[ok], minlength=n_funcs)
    wu = np.bincount(f[ok], weights=(d * runs.mean)[ok], minlength=n_funcs)
    ws = np.bincount(f[ok], weights=(d * runs.std)[ok], minlength=n_funcs)
    has = w > 0
    mu[has] = np.clip(wu[has] / w[has], 0.0, 1.0)
    sigma[has] = np.clip(ws[has] / w[has], 0.0, 1.0)
    return Utilization(mu, sigma)
