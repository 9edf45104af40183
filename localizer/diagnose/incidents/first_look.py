"""The first look (issue 30, Deliver 2): name a slowdown's rank and phase from the hooks' per-step
phase times alone, before (and instead of) a Kineto window. Pure: numpy arrays in, a verdict out.

Input: for each rank, its last steps' phases in ms, steps × (data loading, optimizer step, the
rest), as ``perftracker.runtime.phase_times`` measures them, and optionally the same from before
the slowdown's onset. What it can name:

- **One rank, one phase** (``one_rank``): a rank whose median data loading or optimizer step
  exceeds the median of the other ranks' by at least ``min_share`` of the job's median step, and
  by at least ``min_ratio`` of the others' own time in that phase; the rank with the next largest
  excess in that phase must stand at most half as far out (else it is not one rank).
- **Every rank, one phase** (``all_ranks``, needs the before arrays): on at least ``all_fraction``
  of the ranks the same phase (data loading or optimizer step) grew by at least ``min_share`` of
  the step time before, and it accounts for at least ``explains`` of the step's growth.

What it leaves to the window (``needs_window`` set): a rank or the job slower in "the rest"
(forward, backward, collectives): which kernel, which collective, compute or communication is
what Kineto's critical path tells, the hooks cannot. Nothing at all stands out: no verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from perftracker.model import Box, Category, Finding, Report, Triple

PHASES = ("data loading", "optimizer step", "forward/backward and collectives")  # = runtime.phase_times.PHASES
NAMEABLE = (0, 1)  # phases the first look may name; the rest needs kernel detail
REST = 2


@dataclass(frozen=True)
class FirstLookOptions:
    min_steps: int = 10  # per rank
    min_share: float = 0.10  # an excess (or a growth) of at least this share of the median step
    min_ratio: float = 0.5  # and at least this much more than the peers' own time in that phase
    all_fraction: float = 0.75  # "every rank": at least this share of the ranks
    explains: float = 0.6  # a job-wide phase's growth explains this share of the step's growth


@dataclass(frozen=True)
class FirstLook:
    """The first look's verdict. ``ranks`` empty: no cause named (``reason`` says why;
    ``needs_window``: the slowdown is in forward/backward/collectives, which needs the window)."""

    ranks: tuple[int, ...] = ()
    phase: str = ""
    kind: str = ""  # "one_rank" | "all_ranks" | ""
    ms: float = 0.0  # the named ranks' median time in the phase per step
    reference_ms: float = 0.0  # the other ranks' median (one_rank) or the same ranks' before (all_ranks)
    step_ms: float = 0.0  # the job's median step
    share: float = 0.0  # (ms - reference_ms) / step_ms
    reason: str = ""
    needs_window: bool = False

    @property
    def named(self) -> bool:
        return bool(self.ranks)

    @property
    def title(self) -> str:
        if not self.named:
            return ""
        who = f"rank {self.ranks[0]}" if self.kind == "one_rank" else f"all {len(self.ranks)} ranks"
        than = "its peers'" if self.kind == "one_rank" else "before"
        return (f"{who}: {self.phase} {self.ms:.1f} ms per step against {self.reference_ms:.1f} ms {than} "
                f"(+{100 * self.share:.0f}% of the step)")[:120]


def _medians(phases_ms: Mapping[int, np.ndarray], min_steps: int) -> tuple[list[int], np.ndarray]:
    ranks = sorted(r for r, a in phases_ms.items() if np.asarray(a).ndim == 2 and len(a) >= min_steps)
    if not ranks:
        return [], np.zeros((0, len(PHASES)))
    return ranks, np.stack([np.median(np.asarray(phases_ms[r], dtype=float), axis=0) for r in ranks])


def first_look(phases_ms: Mapping[int, np.ndarray], before_ms: Mapping[int, np.ndarray] | None = None,
               opts: FirstLookOptions | None = None) -> FirstLook:
    """The first look over each rank's per-step phases (see the module docstring)."""
    o = opts or FirstLookOptions()
    ranks, med = _medians(phases_ms, o.min_steps)
    if not ranks:
        return FirstLook(reason=f"no rank has {o.min_steps} steps of phase times")
    step_ms = float(np.median(med.sum(axis=1)))
    if step_ms <= 0:
        return FirstLook(reason="no step time")
    if len(ranks) >= 2:
        got = _one_rank(ranks, med, step_ms, o)
        if got is not None:
            return got
    if before_ms:
        got = _all_ranks(ranks, med, before_ms, o)
        if got is not None:
            return got
    rest_out = _stands_out(ranks, med, REST, step_ms, o) if len(ranks) >= 2 else None
    if rest_out is not None:
        return FirstLook(reason=f"rank {rest_out} is slower in {PHASES[REST]}: which kernel or collective "
                                "needs the window", needs_window=True, step_ms=step_ms)
    return FirstLook(reason="no rank and no phase stands out in the hooks' times", needs_window=True,
                     step_ms=step_ms)


def _excess(med: np.ndarray, p: int) -> np.ndarray:
    """Each rank's time in phase ``p`` minus the median of the other ranks'."""
    col = med[:, p]
    return np.array([col[i] - float(np.median(np.delete(col, i))) for i in range(len(col))])


def _stands_out(ranks: list[int], med: np.ndarray, p: int, step_ms: float, o: FirstLookOptions) -> int | None:
    ex = _excess(med, p)
    i = int(np.argmax(ex))
    others = float(np.median(np.delete(med[:, p], i)))
    if ex[i] < o.min_share * step_ms or ex[i] < o.min_ratio * others:
        return None
    runner_up = float(np.max(np.delete(ex, i))) if len(ex) > 2 else 0.0
    if runner_up > ex[i] / 2:
        return None
    return ranks[i]


def _one_rank(ranks: list[int], med: np.ndarray, step_ms: float, o: FirstLookOptions) -> FirstLook | None:
    best: FirstLook | None = None
    for p in NAMEABLE:
        r = _stands_out(ranks, med, p, step_ms, o)
        if r is None:
            continue
        i = ranks.index(r)
        ref = float(np.median(np.delete(med[:, p], i)))
        got = FirstLook((r,), PHASES[p], "one_rank", float(med[i, p]), ref, step_ms, (float(med[i, p]) - ref) / step_ms)
        if best is None or got.share > best.share:
            best = got
    return best


def _all_ranks(ranks: list[int], med: np.ndarray, before_ms: Mapping[int, np.ndarray],
               o: FirstLookOptions) -> FirstLook | None:
    both, bmed = _medians({r: before_ms[r] for r in ranks if r in before_ms}, o.min_steps)
    if len(both) < 2 or len(both) < o.all_fraction * len(ranks):
        return None
    now = med[[ranks.index(r) for r in both]]
    before_step = float(np.median(bmed.sum(axis=1)))
    growth = now - bmed  # ranks × phases
    step_growth = float(np.median(growth.sum(axis=1)))
    if before_step <= 0 or step_growth < o.min_share * before_step:
        return None
    best: FirstLook | None = None
    for p in NAMEABLE:
        grew = growth[:, p] >= o.min_share * before_step
        if grew.sum() < o.all_fraction * len(ranks) or float(np.median(growth[:, p])) < o.explains * step_growth:
            continue
        named = tuple(r for r, g in zip(both, grew.tolist(), strict=True) if g)
        ms, ref = float(np.median(now[grew, p])), float(np.median(bmed[grew, p]))
        got = FirstLook(named, PHASES[p], "all_ranks", ms, ref, before_step, (ms - ref) / before_step)
        if best is None or got.share > best.share:
            best = got
    return best


_NEXT = {
    "data loading": ("the input pipeline: DataLoader num_workers and pin_memory, the dataset's __getitem__, the "
                     "storage it reads", "a full profile window: perftracker trigger <job>"),
    "optimizer step": ("the optimizer: its implementation (foreach/fused), parameters offloaded to the CPU, "
                       "gradient clipping or hooks in the step", "a full profile window: perftracker trigger <job>"),
}


def first_look_report(look: FirstLook, job: str, session: str, reason: str, ranks: tuple[int, ...],
                      created_ns: int) -> Report:
    """A report of the level "first look" for a named cause: one finding, its measured times as
    evidence (a phase's share of the step as β; the hooks measure no utilization: μ, σ are 0)."""
    if not look.named:
        raise ValueError("first_look_report needs a named cause")
    share = min(1.0, look.ms / look.step_ms) if look.step_ms > 0 else 0.0
    ref = min(1.0, look.reference_ms / look.step_ms) if look.step_ms > 0 else 0.0
    than = "its peers" if look.kind == "one_rank" else "before the slowdown"
    evidence = (
        f"{look.phase}: {look.ms:.1f} ms per step against {look.reference_ms:.1f} ms {than} "
        f"(median of the last steps; the step {look.step_ms:.1f} ms)",
        "measured by the hooks (DataLoader.__next__, the optimizer step's pre/post hooks); no profile window ran",
    )
    finding = Finding(
        key=f"phase:{look.phase}", label=look.phase, category=Category.PYTHON, ranks=look.ranks,
        kind="specific" if look.kind == "one_rank" else "common", tests=("first look",),
        observed=Triple(share, 0.0, 0.0), median=Triple(ref, 0.0, 0.0),
        expected=Box(Triple(0.0, 0.0, 0.0), Triple(ref, 1.0, 1.0)), sentence=look.title,
        impact=min(1.0, max(0.0, look.share)), title=look.title, evidence=evidence,
        next_steps=_NEXT.get(look.phase, ()), cause="first_look")
    return Report(job=job, session=session, kind="slowdown", created_ns=created_ns, trigger_reason=reason,
                  window_s=0.0, ranks_reported=ranks, findings=(finding,), summary=look.title,
                  headline=look.title, level="first look")
