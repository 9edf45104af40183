"""Imbalance with no single culprit rank (issue 28): a pipeline stage that holds more compute than
the others, and work that moves from rank to rank with each step. Pure numpy.

**Stage imbalance.** In a pipeline every stage runs every micro-batch, so a stage that computes
more than the others sets the pace and the others wait for it in their send/recv. Compared like
with like: each worker's compute (the β of its compute functions times its own window, in
seconds), the median per stage. A stage is *heavy* when each of its ranks computes at least
``stage_ratio`` times the lightest stage's median (with two ranks per stage, one slowed rank lifts
the stage's median and lower quartile, not its lightest rank), the median difference is at least ``wait_min`` of the window, and the whole
stage is heavy, not a few of its ranks: its 25th percentile lies above every other stage's 75th.
The finding is the stage, once, never its ranks one by one; its cost is what the lightest stage
waits for it, (heavy − lightest) / window.

**Moving imbalance.** Each worker's ``steps_ms`` is its compute per step (between the step
group's collectives: ``perftracker.agent.summarize.groups``). Within one step group (a
data-parallel group of one stage), per step, the slowest member arrives last and the others wait
``max − own``. The slowest rank *moves* when, over at least ``MIN_STEPS`` steps:

- the typical step's slowest member computes at least ``moving_ratio`` over the group's median
  (median over steps of max / median − 1), so the waits are material;
- no member is the slowest in more than ``moving_share`` of the steps;
- the members' mean compute is even: the highest mean lies above the median mean by less than
  ``even_means`` of the typical step's excess (a rank slow on average is a culprit, and the
  wait evidence names it).

Sequence-length or data imbalance looks like this. The cost is the median member's wait, summed
over the steps, as a share of the window.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from perftracker.localizer.diagnose.evidence.waits import WaitOptions
from perftracker.localizer.diagnose.method.arrays import nan_col_medians

MIN_STEPS = 3


@dataclass(frozen=True)
class StageImbalance:
    heavy: int  # the heavy stage
    lightest: int
    ratio: float  # heavy stage's median compute / the lightest stage's
    members: np.ndarray  # worker columns of the heavy stage
    waiting: np.ndarray  # worker columns of the other stages
    cost: float  # share of the window: what the lightest stage waits for the heavy one


def stage_imbalance(compute_s: np.ndarray, stage: np.ndarray | None, window_s: float,
                    opts: WaitOptions) -> StageImbalance | None:
    """The heavy pipeline stage, or None (see the module doc). compute_s: (N,) seconds."""
    if stage is None or window_s <= 0:
        return None
    stages = [int(s) for s in np.unique(stage) if s >= 0]
    if len(stages) < 2:
        return None
    cols = {s: np.flatnonzero(stage == s) for s in stages}
    med = {s: float(np.median(compute_s[c])) for s, c in cols.items()}
    heavy = max(stages, key=lambda s: (med[s], -s))
    light = min(stages, key=lambda s: (med[s], s))
    q25 = float(np.quantile(compute_s[cols[heavy]], 0.25))
    # the whole stage, every rank of it, not one slow rank among few: its lightest rank passes the
    # ratio (with two ranks per stage, one slowed rank lifts the stage's median and lower quartile)
    if med[light] <= 0 or float(compute_s[cols[heavy]].min()) < opts.stage_ratio * med[light]:
        return None
    if (med[heavy] - med[light]) / window_s < opts.wait_min:
        return None
    if any(q25 <= float(np.quantile(compute_s[c], 0.75)) for s, c in cols.items() if s != heavy):
        return None
    others = np.sort(np.concatenate([c for s, c in cols.items() if s != heavy]))
    return StageImbalance(heavy, light, med[heavy] / med[light], cols[heavy], others,
                          (med[heavy] - med[light]) / window_s)


@dataclass(frozen=True)
class MovingImbalance:
    groups: tuple[int, ...]  # the step groups (JobGroups.groups indexes) where the slowest rank moves
    members: np.ndarray  # their worker columns
    ratio_lo: float  # the slowest member's compute over its group's median, lowest step
    ratio_hi: float  # the same, highest step
    steps: int
    slowest: int  # how many different members were the slowest of some step
    cost: float  # the median member's wait over the steps, share of the window (the costliest group)


def moving_in_group(steps: np.ndarray, opts: WaitOptions) -> tuple[bool, np.ndarray, float]:
    """(moving, max/median per step, the median member's total wait in ms) for one group's
    (members, steps) compute matrix without gaps."""
    m, k = steps.shape
    none = False, np.zeros(0), 0.0
    if m < 3 or k < MIN_STEPS:
        return none
    med = np.median(steps, axis=0)
    if not (med > 0).all():
        return none
    top = steps.max(axis=0)
    ratio = top / med
    if float(np.median(ratio)) - 1.0 < opts.moving_ratio:
        return none
    slowest = np.bincount(np.argmax(steps, axis=0), minlength=m)
    if int(slowest.max()) > opts.moving_share * k:
        return none
    means = steps.mean(axis=1)
    if float(means.max() - np.median(means)) >= opts.even_means * float(np.median(top - med)):
        return none
    wait = float(np.median((top[None, :] - steps).sum(axis=1)))
    return True, ratio, wait


def moving_imbalance(steps: np.ndarray | None, step_group: np.ndarray | None, window_s: float,
                     opts: WaitOptions) -> MovingImbalance | None:
    """Every step group whose slowest member moves from step to step (see the module doc)."""
    if steps is None or step_group is None or window_s <= 0:
        return None
    found: list[tuple[int, np.ndarray, np.ndarray, float]] = []
    for g, cols, sub, full in _step_groups(steps, step_group):
        moving, ratio, wait = moving_in_group(sub[:, full], opts)
        if moving:
            found.append((int(g), cols, ratio, wait))
    if not found:
        return None
    ratios = np.concatenate([r for _, _, r, _ in found])
    members = np.sort(np.concatenate([c for _, c, _, _ in found]))
    n_steps = max(r.size for _, _, r, _ in found)
    slowest = len({int(c[np.argmax(steps[c][:, k])]) for _, c, _, _ in found
                   for k in range(steps.shape[1]) if not np.isnan(steps[c][:, k]).any()})
    cost = max(w for *_, w in found) / 1000.0 / window_s
    return MovingImbalance(tuple(g for g, *_ in found), members, float(ratios.min()), float(ratios.max()),
                           n_steps, slowest, cost)


def compute_seconds(beta: np.ndarray, compute: Sequence[int], window_s: np.ndarray | None,
                    default_s: float) -> np.ndarray:
    """(N,) each worker's compute in seconds: the β of its compute functions times its own window."""
    total = beta[list(compute)].sum(axis=0) if len(compute) else np.zeros(beta.shape[1])
    w = np.full(beta.shape[1], default_s) if window_s is None else np.where(window_s > 0, window_s, default_s)
    return np.asarray(total * w, dtype=np.float64)


def step_waits(steps: np.ndarray) -> np.ndarray:
    """(M,) each member's wait for the slowest member of each step, summed over the steps (ms):
    Σ_i (max_i − c_ij) over a (members, steps) compute matrix without gaps."""
    return np.asarray((steps.max(axis=0)[None, :] - steps).sum(axis=1), dtype=np.float64)


def step_late(steps: np.ndarray | None, step_group: np.ndarray | None, window_s: float, opts: WaitOptions
              ) -> list[tuple[int, np.ndarray, np.ndarray, float]]:
    """Per step group, the members that are late *on average* over the steps: (group, late columns,
    waiting columns, the waiters' median wait for them as a share of the window).

    The wait of each member is what it waits, step by step, for that step's slowest member
    (``step_waits``), whatever the trace shows that wait as (a collective kernel that spins, or an
    idle GPU before a collective that starts when the last member arrives). A member that waits
    much less than the others is the one they wait for: the same outlier test as the collective
    shares (``late_workers``), on these waits as shares of the window. Work that moves from rank to
    rank spreads the waits evenly and finds no one (``moving_imbalance`` says so instead)."""
    from perftracker.localizer.diagnose.evidence.waits import late_workers

    out: list[tuple[int, np.ndarray, np.ndarray, float]] = []
    if steps is None or step_group is None or window_s <= 0:
        return out
    for g, cols, sub, full in _step_groups(steps, step_group):
        if cols.size < 2 or int(full.sum()) < MIN_STEPS:
            continue
        w = step_waits(sub[:, full]) / 1000.0 / window_s
        late, share = late_workers(w, opts)
        if late.any():
            out.append((int(g), np.sort(cols[late]), np.sort(cols[~late]), share))
    return out


def stage_saves(steps: np.ndarray, stage: np.ndarray, heavy: int) -> float:
    """What balancing the stages would save, in ms summed over the steps: per step, the heavy
    stage's median compute brought to the mean of the stages' medians. A stated estimate."""
    stages = [int(s) for s in np.unique(stage) if s >= 0]
    med = {s: nan_col_medians(steps[stage == s]) for s in stages}
    mean = np.mean([med[s] for s in stages], axis=0)
    gain = med[heavy] - mean
    return float(np.nansum(np.clip(gain, 0.0, None)))


def moving_saves(steps: np.ndarray, step_group: np.ndarray, groups: tuple[int, ...]) -> float:
    """What an even split of the work would save, in ms summed over the steps: per step, the
    slowest member of the costliest moving group brought to its median. A stated estimate."""
    best = 0.0
    for g in groups:
        _, sub, full = _step_group(steps, step_group, g)
        sub = sub[:, full]
        if sub.size:
            best = max(best, float((sub.max(axis=0) - np.median(sub, axis=0)).sum()))
    return best


def steady_excess(steps: np.ndarray | None, step_group: np.ndarray | None, group: int, late: np.ndarray,
                  window_s: float) -> float:
    """How much longer the ``late`` columns compute, on average over the steps, than the median
    member of step group ``group``, summed over those steps as a share of the window (0 without
    steps). Work that moves from rank to rank leaves every member's mean even; a rank that is slower
    in every step (a slow GPU) keeps its excess in the mean, however much the slowest rank of each
    step moves around it (issue 28)."""
    if steps is None or step_group is None or window_s <= 0 or late.size == 0:
        return 0.0
    cols, sub, full = _step_group(steps, step_group, group)
    if cols.size < 2 or not np.isin(late, cols).all():
        return 0.0
    if not full.any():
        return 0.0
    means = sub[:, full].mean(axis=1)
    excess = float(np.median(means[np.isin(cols, late)]) - np.median(means))
    return max(0.0, excess) * int(full.sum()) / 1000.0 / window_s


def _step_groups(steps: np.ndarray, step_group: np.ndarray
                 ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(group, its worker columns, their per-step compute, the steps every member has) per group."""
    for g in np.unique(step_group):
        if g < 0:
            continue
        yield (int(g), *_step_group(steps, step_group, int(g)))


def _step_group(steps: np.ndarray, step_group: np.ndarray, g: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step group ``g``'s worker columns, their per-step compute, and the steps every member has."""
    cols = np.flatnonzero(step_group == g)
    sub = steps[cols]
    return cols, sub, ~np.isnan(sub).any(axis=0)
