"""A cost budget for profile windows, in training time lost (issue 30, Deliver 3): pure arithmetic.

Windows spend from a budget of measured training time lost. The budget **accrues with training
time**: over the trailing hour (``horizon_s``) the windows may spend ``fraction`` (2 %) of the
training time in that hour, so a job that has trained T s (T <= an hour) has 0.02·T s, and any
later hour 72 s. A job's first seconds would allow no window at all, so an explicit
``initial_s`` (``PERFTRACKER_WINDOW_BUDGET_INITIAL_S``) is an advance on the accrual: the
allowance is ``max(initial_s, fraction · trained_s)``, and what the first window spent is paid
back by the training that follows (the next automatic window waits until 2 % of the training
time covers what was spent plus the next window's expected cost). Over the job's first hour the
windows spend at most ``max(initial_s, 0.02·T)``; over any later hour at most 2 %.

A window's cost is estimated online from iteration times (``lost_s``): from the window's first
iteration boundary to the end of its after-phase, the wall time minus what the iterations done in
it would have taken at the median iteration time before the window. The detector's automatic
windows are refused when the cost expected of the next one does not fit in what is left; manual
windows (``perftracker trigger``) are never refused, and are counted (their cost is spent too).

The expected cost of the next window is the largest cost measured over the sliding hour, or
``first_guess_s`` when there is none.

**Worth a window** (``worth_window``): an automatic window also waits until the slowdown it would
diagnose is worth its cost. A slowdown of ratio r takes (1 − 1/r) of the wall time; had it lasted as
long as the job has trained (T, at most the horizon), it would have cost (1 − 1/r)·T. The window
opens once that is at least the window's expected cost: a 1.2× slowdown in a job 8 s old (1.3 s)
does not buy a 5 s window; the same slowdown after 30 s of training does, and any slowdown of a job
trained for an hour (0.1 % of an hour is 3.6 s). Until then the trigger is held, not dropped
(``perftracker/runtime/trigger/defer.py``): it is sent when it becomes worth it, if the job is still
slow, and is let go when the job is back to its speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

FRACTION = 0.02
HORIZON_S = 3600.0
FIRST_GUESS_S = 5.0
INITIAL_S = 10.0  # the advance for a job's first window(s): docs/window-cost.md, "The cost budget"
MIN_WORTH_S = 1.0  # worth_window weighs at least this: a window measured at ~0 s does not make every blip worth one


def lost_s(elapsed_s: float, iterations: int, baseline_iteration_s: float) -> float:
    """Training time lost over ``elapsed_s`` of wall time in which ``iterations`` iterations
    completed, against ``baseline_iteration_s`` each (the median before the window). Negative
    when training ran faster than before (the background load fell): kept, not clipped, so that
    noise averages out over windows; the budget never credits a negative spend (``spend``)."""
    return float(elapsed_s) - max(int(iterations), 0) * float(baseline_iteration_s)


def worth_window(ratio: float, trained_s: float, expected_cost_s: float) -> bool:
    """Whether a slowdown of ``ratio`` (slow / before) in a job that has trained ``trained_s`` is
    worth a window expected to cost ``expected_cost_s``: (1 − 1/ratio) · trained_s ≥ the cost. A
    ratio that is not a number above 1 (a trigger that is not a measured slowdown) is always worth it."""
    if not isinstance(ratio, (int, float)) or not ratio > 1.0:  # NaN is not > 1.0
        return True
    return (1.0 - 1.0 / float(ratio)) * max(float(trained_s), 0.0) >= float(expected_cost_s)


def median(values: Sequence[float]) -> float:
    xs = sorted(float(v) for v in values if v == v and v > 0)
    if not xs:
        return 0.0
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])


@dataclass(frozen=True)
class Spend:
    t_s: float  # when the window's cost was measured (monotonic s)
    lost_s: float  # measured, >= 0
    manual: bool
    session: str = ""


@dataclass
class CostBudget:
    fraction: float = FRACTION
    horizon_s: float = HORIZON_S
    first_guess_s: float = FIRST_GUESS_S
    initial_s: float = INITIAL_S
    started_s: float | None = None  # when training began (monotonic s); None: not known yet
    spends: list[Spend] = field(default_factory=list)
    refused: int = 0

    @property
    def limit_s(self) -> float:
        """The most any hour may spend once the job has trained a whole hour."""
        return self.fraction * self.horizon_s

    def trained_s(self, now_s: float) -> float:
        """Training time in the trailing horizon: since training began, at most the horizon (0 while
        the start is unknown)."""
        if self.started_s is None:
            return 0.0
        return min(max(0.0, now_s - self.started_s), self.horizon_s)

    def allowance_s(self, now_s: float) -> float:
        """What windows may have spent over the trailing horizon by ``now_s``: ``fraction`` of the
        training time in it, or the initial advance while that is more."""
        return max(self.initial_s, self.fraction * self.trained_s(now_s))

    def _recent(self, now_s: float) -> list[Spend]:
        return [s for s in self.spends if now_s - self.horizon_s < s.t_s <= now_s]

    def spent_s(self, now_s: float) -> float:
        """Training time lost to windows over the sliding horizon ending at ``now_s``."""
        return sum(s.lost_s for s in self._recent(now_s))

    def left_s(self, now_s: float) -> float:
        return max(0.0, self.allowance_s(now_s) - self.spent_s(now_s))

    def expected_s(self, now_s: float) -> float:
        """The cost expected of the next window: the largest measured over the horizon."""
        recent = self._recent(now_s)
        return max((s.lost_s for s in recent), default=self.first_guess_s)

    def allows(self, now_s: float) -> bool:
        """May an automatic window open now? (Manual ones always may.)"""
        return self.expected_s(now_s) <= self.left_s(now_s)

    def worth(self, now_s: float, ratio: float) -> bool:
        """``worth_window`` for a slowdown of ``ratio`` detected now (against at least ``MIN_WORTH_S``)."""
        return worth_window(ratio, self.trained_s(now_s), max(self.expected_s(now_s), MIN_WORTH_S))

    def ask(self, now_s: float, manual: bool) -> bool:
        """A window wants to open: True if it may; a refused automatic one is counted."""
        if manual or self.allows(now_s):
            return True
        self.refused += 1
        return False

    def spend(self, now_s: float, lost_s: float, manual: bool, session: str = "") -> Spend:
        """Record a window's measured cost (a negative estimate spends nothing). Spends older than
        the horizon are dropped."""
        s = Spend(now_s, max(0.0, float(lost_s)), manual, session)
        self.spends = [x for x in self.spends if now_s - x.t_s < self.horizon_s] + [s]
        return s

    def to_dict(self, now_s: float) -> dict[str, object]:
        recent = self._recent(now_s)
        return {
            "fraction": self.fraction, "horizon_s": self.horizon_s, "limit_s": round(self.limit_s, 3),
            "initial_s": round(self.initial_s, 3), "trained_s": round(self.trained_s(now_s), 3),
            "allowance_s": round(self.allowance_s(now_s), 3),
            "spent_s": round(self.spent_s(now_s), 3), "left_s": round(self.left_s(now_s), 3),
            "expected_next_s": round(self.expected_s(now_s), 3),
            "windows": len(recent), "manual_windows": sum(s.manual for s in recent), "refused": self.refused,
            "last_window_lost_s": round(recent[-1].lost_s, 3) if recent else None,
            "last_window_session": recent[-1].session if recent else "",
        }
