"""A report's comparison with the job's healthy baseline, "since it was fast" (issue 49). No I/O.

``SinceFast`` says whether the job has a baseline, when it was taken, the step time then and now,
and each function whose share of the window grew since then on most ranks (``Change``). The
comparison itself is perftracker.localizer.diagnose.evidence.baseline; the finding a job-wide change
becomes, perftracker.localizer.diagnose.verdict.since_fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perftracker.model.patterns import Category, Triple, parse_category
from perftracker.model.schema import int_items, optional, require, rounded


@dataclass(frozen=True)
class Change:
    """One function whose share grew since the baseline, on ``ranks`` of the ``compared`` ranks."""

    key: str
    label: str
    category: Category
    ranks: tuple[int, ...]
    compared: int
    then: Triple  # median (β, μ, σ) at the baseline over ``ranks``
    now: Triple  # median (β, μ, σ) now over ``ranks``
    new: bool = False  # the baseline did not run it at all

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "category": self.category.value, "ranks": list(self.ranks),
                "compared": self.compared, "then": self.then.to_dict(), "now": self.now.to_dict(), "new": self.new}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Change:
        where = "SinceFast.changes[]"
        return cls(key=require(d, "key", str, where), label=require(d, "label", str, where),
                   category=parse_category(require(d, "category", str, where), where),
                   ranks=int_items(require(d, "ranks", list, where), f"{where}.ranks"),
                   compared=require(d, "compared", int, where),
                   then=Triple.from_dict(require(d, "then", dict, where)),
                   now=Triple.from_dict(require(d, "now", dict, where)),
                   new=optional(d, "new", bool, where, False))


@dataclass(frozen=True)
class SinceFast:
    """The report's baseline line. ``baseline_session`` "" : the job has no baseline (``note`` says so)."""

    note: str  # one plain sentence
    baseline_session: str = ""
    taken_ns: int = 0  # wall clock
    step_ms_then: float = 0.0  # 0: unknown
    step_ms_now: float = 0.0
    changes: tuple[Change, ...] = ()
    # did the fix pay: the previous report's predicted saving beside the step time measured now ("" : none)
    paid: str = ""

    @property
    def has_baseline(self) -> bool:
        return bool(self.baseline_session)

    def to_dict(self) -> dict[str, Any]:
        return {"note": self.note, "baseline_session": self.baseline_session, "taken_ns": self.taken_ns,
                "step_ms_then": rounded(self.step_ms_then), "step_ms_now": rounded(self.step_ms_now),
                "changes": [c.to_dict() for c in self.changes], **({"paid": self.paid} if self.paid else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SinceFast:
        where = "SinceFast"
        return cls(note=require(d, "note", str, where),
                   baseline_session=optional(d, "baseline_session", str, where, ""),
                   taken_ns=optional(d, "taken_ns", int, where, 0),
                   step_ms_then=float(optional(d, "step_ms_then", float, where, 0.0)),
                   step_ms_now=float(optional(d, "step_ms_now", float, where, 0.0)),
                   changes=tuple(Change.from_dict(c) for c in optional(d, "changes", list, where, [])),
                   paid=optional(d, "paid", str, where, ""))
