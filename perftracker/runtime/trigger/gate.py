"""Which slowdown detections become automatic triggers (docs/design.md section 3). Pure: times come in.

Every automatic trigger costs the job one profile window, so detections are rate-limited. The old
rule (no second trigger within ``cooldown_s``) lost real slowdowns: a short burst of whole-job
noise fired, its window saw nothing, and a fault that began a few seconds later was dropped for
the next two minutes (seen in bench/faults.py's onset scenarios on a shared host). The rule fired
and re-baselined on the dropped detection, so nothing brought it back.

The gate is a token bucket instead:

- ``burst`` triggers may come close together; the bucket refills at one per ``cooldown_s``, so
  over time the job pays at most one window per ``cooldown_s``, as before.
- A detection within ``min_gap_s`` of the last trigger is *absorbed*: that trigger's window (of
  this length) is still profiling the job, so the slowdown is being looked at already.
- ``cooldown_s <= 0`` turns the limit off (every detection triggers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ADMIT = "admit"
ABSORBED = "absorbed"  # inside the window the last trigger opened
OVER_BUDGET = "over budget"  # the bucket is empty


@dataclass
class TriggerGate:
    cooldown_s: float = 120.0  # one token comes back per cooldown_s
    burst: int = 2  # bucket size: triggers that may come close together
    min_gap_s: float = 20.0  # detections this soon after a trigger are absorbed by its window
    _tokens: float = field(init=False, default=0.0)
    _refilled_ns: int | None = field(init=False, default=None)
    _last_ns: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.burst < 1:
            raise ValueError(f"trigger burst must be at least 1, got {self.burst}")
        self._tokens = float(self.burst)

    def admit(self, t_ns: int) -> str:
        """ADMIT (and spend a token), ABSORBED or OVER_BUDGET for a detection at ``t_ns``."""
        if self.cooldown_s <= 0:
            self._last_ns = t_ns
            return ADMIT
        if self.absorbs(t_ns):
            return ABSORBED
        self._refill(t_ns)
        if self._tokens < 1.0:
            return OVER_BUDGET
        self._tokens -= 1.0
        self._last_ns = t_ns
        return ADMIT

    def absorbs(self, t_ns: int) -> bool:
        """Whether a detection at ``t_ns`` falls in the window of the last trigger (no token spent)."""
        return (self.cooldown_s > 0 and self._last_ns is not None
                and t_ns - self._last_ns < min(self.min_gap_s, self.cooldown_s) * 1e9)

    def tokens(self, t_ns: int) -> float:
        """Triggers available now (for status)."""
        if self.cooldown_s <= 0:
            return float(self.burst)
        self._refill(t_ns)
        return self._tokens

    def _refill(self, t_ns: int) -> None:
        if self._refilled_ns is not None and t_ns > self._refilled_ns:
            gained = (t_ns - self._refilled_ns) / (self.cooldown_s * 1e9)
            self._tokens = min(float(self.burst), self._tokens + gained)
        if self._refilled_ns is None or t_ns > self._refilled_ns:
            self._refilled_ns = t_ns
