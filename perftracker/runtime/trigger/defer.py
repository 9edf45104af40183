"""Automatic triggers held until their slowdown is worth a window (issue 30; pure: times and
iteration times come in).

The budget (``window_budget.worth_window``) says a slowdown of ratio r in a job that has trained T s
is worth a window expected to cost C once (1 − 1/r)·T ≥ C. A detection that is not worth it yet is
held here, not dropped (the detector has moved its baseline past it and would not fire again):
every few seconds ``check`` looks at the iterations since, and

- sends it (returns it, with ``deferred_s`` and the ratio now) once the job is still slow and the
  slowdown is now worth the window;
- lets it go when the job is back to its speed: the mean of the recent iterations is below the
  midpoint (in log time) between the detection's baseline and its slow level — a blip that cost less
  than a window would have (counted in ``passed``);
- lets it go after ``max_wait_s`` (counted in ``expired``);
- lets it go when a window opens anyway (another rank's trigger, a manual one, a newer detection
  worth a window at once): that window profiles the slowdown (counted in ``covered``).

A newer detection replaces a held one (it has the fresher baseline); the time held counts from the
first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from perftracker.model.trigger import Detection

RECENT_ITERS = 20  # the iterations the still-slow test averages (means catch intermittent stalls too)
MAX_WAIT_S = 900.0


@dataclass
class Held:
    reason: str
    detail: dict[str, object]
    since_s: float
    base_ms: float
    slow_ms: float


def slow_levels(detail: Mapping[str, object]) -> tuple[float, float] | None:
    """(baseline, slow level) in ms from a detector's detail, or None when it has no such pair: read
    as the typed detection reads it (perftracker/model/trigger.py ``Detection.from_detail``)."""
    d = Detection.from_detail(0, "", detail)
    if d.baseline_ms is None or d.slow_ms is None or not d.baseline_ms < d.slow_ms:
        return None
    return d.baseline_ms, d.slow_ms


def still_slow(level_ms: float, base_ms: float, slow_ms: float) -> bool:
    """``level_ms`` is above the midpoint, in log time, between a detection's baseline and slow level."""
    return level_ms > 0 and math.log(level_ms) > 0.5 * (math.log(base_ms) + math.log(slow_ms))


@dataclass
class TriggerDeferral:
    max_wait_s: float = MAX_WAIT_S
    held: Held | None = None
    passed: int = 0  # held detections let go: the job was back to its speed
    expired: int = 0  # held longer than max_wait_s
    sent_late: int = 0  # held detections sent once worth a window
    covered: int = 0  # held detections let go because a window opened anyway

    def cover(self) -> None:
        """A window opens (for whatever reason): the held detection is profiled by it."""
        if self.held is not None:
            self.held = None
            self.covered += 1

    def hold(self, reason: str, detail: Mapping[str, object], now_s: float) -> bool:
        """Hold a detection; False when it has no baseline and slow level to test against (send it)."""
        levels = slow_levels(detail)
        if levels is None:
            return False
        since = self.held.since_s if self.held is not None else now_s
        self.held = Held(reason, dict(detail), since, *levels)
        return True

    def check(self, now_s: float, recent_ms: Sequence[float],
              worth: Callable[[float], bool]) -> tuple[str, dict[str, object]] | None:
        """The held detection to send now, or None (still held, or let go)."""
        h = self.held
        if h is None:
            return None
        if now_s - h.since_s > self.max_wait_s:
            self.held = None
            self.expired += 1
            return None
        xs = [float(x) for x in list(recent_ms)[-RECENT_ITERS:]
              if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf]
        if not xs:
            return None
        mean_ms = sum(xs) / len(xs)
        if not still_slow(mean_ms, h.base_ms, h.slow_ms):
            self.held = None
            self.passed += 1
            return None
        ratio = mean_ms / h.base_ms
        if not worth(ratio):
            return None
        self.held = None
        self.sent_late += 1
        detail = dict(h.detail)
        detail.update(deferred_s=round(now_s - h.since_s, 3), ratio_when_sent=round(ratio, 4))
        return h.reason, detail

    def to_dict(self) -> dict[str, object]:
        return {"held": self.held is not None, "passed": self.passed, "expired": self.expired,
                "sent_late": self.sent_late, "covered": self.covered}
