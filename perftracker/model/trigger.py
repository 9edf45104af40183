"""A detection: what made a worker ask for a profile window, typed (issue 48).

The detector's test (perftracker/runtime/slowdown.py, detector.py) hands the runtime a detail
mapping; ``Detection.from_detail`` reads it once, here, into fields. The Detection then travels as
JSON (``to_dict``, ``schema_version`` like the other wire types): worker -> node agent (the TRIGGER
message's ``detection``) -> localizer (the trigger request) -> the session's record -> the
report's ``trigger``. Renderers format it (``sentence``, ``text``); nobody parses a sentence back.
No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perftracker.model.schema import SCHEMA_VERSION, check_schema_version, optional, require

DETECTION_SCHEMA_VERSION = SCHEMA_VERSION
DETECTOR, MANUAL = "detector", "manual"  # where a trigger came from


def _number(detail: Mapping[str, object], *keys: str) -> float | None:
    """The first of ``keys`` that holds a finite number (never a bool)."""
    for key in keys:
        v = detail.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def _integer(detail: Mapping[str, object], key: str) -> int | None:
    v = detail.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Detection:
    """One trigger as the worker saw it. Times in ms; ``ratio`` is slow level / baseline."""

    rank: int
    reason: str  # "slowdown", or a manual trigger's reason
    source: str = DETECTOR  # DETECTOR or MANUAL
    test: str = ""  # the detector's test: "cusum", "drift", "window4", "post-window", "paper", ...
    iteration: int | None = None  # the iteration it fired at
    baseline_ms: float | None = None  # the iteration time before the slowdown
    slow_ms: float | None = None  # the slow level the test saw
    ratio: float | None = None
    noise: float | None = None  # the test's noise estimate (log scale), when it has one
    deferred_s: float | None = None  # held this long until the slowdown was worth a window
    ratio_when_sent: float | None = None  # the ratio when a held detection went out
    schema_version: int = DETECTION_SCHEMA_VERSION

    @classmethod
    def from_detail(cls, rank: int, reason: str, detail: Mapping[str, object]) -> Detection:
        """From the runtime's trigger detail (the detector's keys, or a manual trigger's)."""
        base = _number(detail, "baseline_ms", "shortest_ms")
        slow = _number(detail, "recent_ms", "mean_ms")
        ratio = _number(detail, "ratio")
        source = detail.get("source")
        test = detail.get("test", detail.get("rule", ""))
        return cls(rank=int(rank), reason=str(reason), source=str(source) if source in (DETECTOR, MANUAL) else DETECTOR,
                   test=str(test or ""), iteration=_integer(detail, "iteration"),
                   baseline_ms=base if base is not None and base > 0 else None,
                   slow_ms=slow if slow is not None and slow > 0 else None,
                   ratio=ratio if ratio is not None and ratio > 0 else None, noise=_number(detail, "noise"),
                   deferred_s=_number(detail, "deferred_s"), ratio_when_sent=_number(detail, "ratio_when_sent"))

    def sentence(self) -> str:
        """"slowdown at iteration 312 (+18% over 45.1 ms)": what the worker saw, without its rank."""
        text = self.reason
        if self.iteration is not None:
            text += f" at iteration {self.iteration}"
        if self.ratio is not None and self.baseline_ms is not None:
            text += f" ({100 * (self.ratio - 1):+.0f}% over {self.baseline_ms:.1f} ms)"
        return text

    def reason_text(self) -> str:
        """"rank 2: slowdown at iteration 312 (+18% over 45.1 ms)": the session's reason line."""
        return f"rank {self.rank}: {self.sentence()}"

    def text(self) -> str:
        """"slowdown at iteration 268 (+49% over 42.9 ms), detected on rank 2": for a report, where the
        rank reads as the one that noticed, not as the culprit."""
        return f"{self.sentence()}, detected on rank {self.rank}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schema_version": self.schema_version, "rank": self.rank, "reason": self.reason,
                             "source": self.source, "test": self.test}
        for key in ("iteration", "baseline_ms", "slow_ms", "ratio", "noise", "deferred_s", "ratio_when_sent"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "detection") -> Detection:
        """Read ``to_dict``'s JSON; SchemaError naming the field on a bad one."""
        version = check_schema_version(d, where)
        return cls(
            rank=require(d, "rank", int, where), reason=require(d, "reason", str, where),
            source=optional(d, "source", str, where, DETECTOR), test=optional(d, "test", str, where, ""),
            iteration=optional(d, "iteration", int, where, None),
            baseline_ms=optional(d, "baseline_ms", float, where, None),
            slow_ms=optional(d, "slow_ms", float, where, None), ratio=optional(d, "ratio", float, where, None),
            noise=optional(d, "noise", float, where, None), deferred_s=optional(d, "deferred_s", float, where, None),
            ratio_when_sent=optional(d, "ratio_when_sent", float, where, None), schema_version=version)
