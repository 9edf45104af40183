"""The training thread's wait for a CPU core, from schedstat ``run_delay`` (the ``cpu_wait`` series).

``/proc/<pid>/task/<tid>/schedstat`` holds, second, ``sched_info.run_delay``: the nanoseconds the
thread has spent runnable on a run queue without a core. The kernel credits a wait when it ends
(``sched_info_arrive``, as the thread gets a core), so an increase Δw seen at reading i is a wait
that ended inside (t[i-1], t[i]]. The thread then ran for Δr_i (its run-time increase at that
reading; it runs on after it arrives), so the wait is placed at [t[i] − Δr_i − Δw, t[i] − Δr_i].

What it measures: CPU time the thread wanted and did not get. A cgroup CPU quota (throttled time
counts as run_delay: measured on Linux 6.18, a 25 % quota read 0.50 s run / 1.50 s wait over 2 s),
a busy process on the same cores, or an oversubscribed node. Sleeping, blocking on a lock or in a
collective is not a wait (the thread is not runnable).

``value[i]`` is the share of (t[i-1], t[i]] spent waiting, in [0, 1], like every ``UtilSeries``.
``perftracker.agent.summarize.timeline.wait_intervals`` turns the series back into intervals for
the summarizer.
"""

from __future__ import annotations

import numpy as np

from perftracker.model.raw_window import CPU_WAIT, UtilSeries

RESOURCE = CPU_WAIT


def cpu_wait_series(t_ns: np.ndarray, run_ns: np.ndarray, wait_ns: np.ndarray, period_ns: int,
                    source: str = "schedstat") -> UtilSeries:
    """Share of each sample interval the thread spent runnable without a core.

    ``run_ns`` and ``wait_ns`` are the cumulative run time and run_delay read at ``t_ns``.
    """
    t = np.asarray(t_ns, dtype=np.int64)
    r = np.asarray(run_ns, dtype=np.int64)
    w = np.asarray(wait_ns, dtype=np.int64)
    if len(t) < 2:
        return UtilSeries(RESOURCE, np.zeros(0, np.int64), np.zeros(0, np.float32), period_ns, source)
    dr = np.maximum(np.diff(r), 0)
    dw = np.maximum(np.diff(w), 0)
    k = np.flatnonzero(dw > 0)  # reading k + 1 saw a wait end
    if len(k) == 0:
        return UtilSeries(RESOURCE, t[1:], np.zeros(len(t) - 1, np.float32), period_ns, source)
    end = np.clip(t[k + 1] - dr[k], t[k], t[k + 1])  # increasing: each lies in its own reading interval
    prev_end = np.r_[t[0], end[:-1]]
    start = np.maximum(end - dw[k], prev_end)  # waits do not overlap, and none starts before the first reading
    cum_w = np.cumsum(dw[k]).astype(np.float64)
    xp = np.empty(1 + 2 * len(k), dtype=np.float64)
    fp = np.empty_like(xp)
    xp[0], fp[0] = t[0], 0.0
    xp[1::2], fp[1::2] = start, np.r_[0.0, cum_w[:-1]]
    xp[2::2], fp[2::2] = end, cum_w
    cum = np.interp(t.astype(np.float64), xp, fp)
    dt = np.diff(t).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(dt > 0, np.diff(cum) / dt, 0.0)
    return UtilSeries(RESOURCE, t[1:], np.clip(share, 0.0, 1.0).astype(np.float32), period_ns, source)
