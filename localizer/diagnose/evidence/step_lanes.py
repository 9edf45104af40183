"""The report's picture of one step: a lane per chosen rank (the culprit, a typical waiting rank,
one rank per pipeline stage), each split into host, compute, waiting, communication and other time.

Drawn from the window's patterns: a rank's critical-path shares per category (β summed over its
functions), scaled to its median step (its own iteration times, else the window). A collective's
share splits into waiting (the waits the findings measured for the ranks that wait for their
culprits, at most the collective share) and communication (the rest). Shares in a fixed order, not a timeline. Pure
numpy over PatternArrays; no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np
from perftracker.localizer.diagnose.evidence.host_bound import HOST_KEY, IDLE_KEY, beta_sum
from perftracker.localizer.diagnose.method.arrays import PatternArrays
from perftracker.localizer.diagnose.method.intsets import columns_of, setdiff_ints

from perftracker.model import LINK_KEY, Category, Finding, Lane
from perftracker.model.hardware import is_health
from perftracker.model.schema import rounded

MAX_STAGE_LANES = 8


def category_shares(arr: PatternArrays) -> dict[str, np.ndarray]:
    """Per worker: the share of the window in host, compute, collective and other time."""
    cats = np.array([i.category.priority for i in arr.functions], dtype=np.int64)
    real = np.array([i.key not in (HOST_KEY, IDLE_KEY, LINK_KEY) and not is_health(i.key) for i in arr.functions],
                    dtype=bool)
    n = arr.n_workers

    def total(mask: np.ndarray) -> np.ndarray:
        rows = np.flatnonzero(mask & real).tolist()
        return beta_sum(arr.values, rows) if rows else np.zeros(n)

    compute = total((cats == Category.COMPUTE.priority) | (cats == Category.MEMORY.priority))
    collective = total(cats == Category.COLLECTIVE.priority)
    host = total(cats == Category.PYTHON.priority)
    # functions on concurrent streams can each hold a share of the same moment: past the window,
    # the shares are scaled to it (the parts then say how the busy time divides)
    scale = np.maximum(compute + collective + host, 1.0)
    compute, collective, host = compute / scale, collective / scale, host / scale
    other = np.clip(1.0 - compute - collective - host, 0.0, 1.0)
    return {"host": host, "compute": compute, "collective": collective, "other": other}


def _waiting(arr: PatternArrays, collective: np.ndarray, findings: Sequence[Finding]) -> np.ndarray:
    """Each worker's waiting: the waits the findings measured for the ranks that wait for their
    culprits (a wait's share is its waiting ranks' median), at most its collective share."""
    waiting = np.zeros(arr.n_workers)
    for f in findings:
        for wt in f.waits:
            waiting[columns_of(arr.ranks, wt.ranks)] += wt.share
    out: np.ndarray = np.minimum(waiting, collective)
    return out


def _step_ms(arr: PatternArrays, w: int) -> float:
    series = arr.iteration_ms.get(int(arr.ranks[w]), ())
    if series:
        return float(statistics.median(series))
    own = arr.worker_window_s[w] if arr.worker_window_s is not None else arr.window_s
    return float(own) * 1000.0


def _median_worker(workers: np.ndarray, score: np.ndarray) -> int:
    order = workers[np.argsort(score[workers], kind="stable")]
    return int(order[order.size // 2])


def choose_workers(arr: PatternArrays, findings: Sequence[Finding], busy: np.ndarray) -> list[tuple[int, str]]:
    """(worker column, role): the first culprit finding's rank, a typical waiting rank, one per stage."""
    chosen: list[tuple[int, str]] = []
    culprit = next((f for f in findings if f.kind != "common" and f.ranks), None)
    if culprit is not None:
        cols = columns_of(arr.ranks, culprit.ranks)
        if cols.size:
            chosen.append((int(cols[np.argmax(busy[cols])]), "culprit"))
    taken = {w for w, _ in chosen}
    waits = [np.asarray(wt.ranks, dtype=np.int64) for f in findings[:1] for wt in f.waits]
    waiters = columns_of(arr.ranks, np.concatenate(waits)) if waits else np.zeros(0, dtype=np.int64)
    pool = waiters if waiters.size else setdiff_ints(np.arange(arr.n_workers), list(taken))
    if pool.size:
        w = _median_worker(pool, busy)
        if w not in taken:
            chosen.append((w, "waits" if waiters.size else "typical"))
            taken.add(w)
    if arr.stage is not None:
        stages = [int(s) for s in np.unique(arr.stage) if s >= 0]
        if len(stages) > 1:
            chosen = [(w, f"{role}, stage {int(arr.stage[w])}") for w, role in chosen]
            covered = {int(arr.stage[w]) for w in taken}
            for s in stages[:MAX_STAGE_LANES]:
                if s in covered:
                    continue
                w = _median_worker(np.flatnonzero(arr.stage == s), busy)
                chosen.append((w, f"stage {s}"))
                taken.add(w)
    return chosen


def step_lanes(arr: PatternArrays, findings: Sequence[Finding]) -> tuple[Lane, ...]:
    """The lanes of the report's step picture (empty for a window without patterns)."""
    if arr.n_workers == 0 or not arr.functions:
        return ()
    shares = category_shares(arr)
    waiting = _waiting(arr, shares["collective"], findings)
    communication = shares["collective"] - waiting
    lanes = []
    for w, role in choose_workers(arr, findings, shares["compute"] + shares["host"]):
        step = _step_ms(arr, w)
        parts = (("host", shares["host"][w]), ("compute", shares["compute"][w]), ("waiting", waiting[w]),
                 ("communication", communication[w]), ("other", shares["other"][w]))
        lanes.append(Lane(rank=int(arr.ranks[w]), role=role, step_ms=rounded(step),  # rounded as stored,
                          parts=tuple((name, rounded(float(share) * step)) for name, share in parts)))  # round-trips
    return tuple(lanes)
