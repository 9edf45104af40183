"""Reports: a localizer's verdict for one session (findings, top functions, hang states). No I/O.

Import these from ``perftracker.model`` (the public path); this module holds them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perftracker.errors import SchemaError
from perftracker.model.measured import null_to_zero, samples_measured, unmeasured_to_null
from perftracker.model.patterns import Category, Triple, parse_category
from perftracker.model.schema import (
    check_schema_version,
    float_items,
    int_items,
    optional,
    require,
    rounded,
)
from perftracker.model.since_fast import SinceFast
from perftracker.model.trigger import Detection
from perftracker.model.window_cost import window_cost_fields

# Version 2 (issue 32) adds a finding's ``title``, ``evidence``, ``next_steps`` and ``cause``, the
# report's ``headline`` and ``step_lanes``; version 1 documents (``sentence`` and ``summary`` only)
# are still read, and version 2 still writes ``sentence`` and ``summary`` (dropped in version 3).
# Version 3 (issue 47) writes μ and σ that were not measured (offline traces) as null
# (``measured.py``) and a finding's ``spread`` ("common", "specific", "random": how it spreads over
# the ranks), the same value as its ``kind``, which is kept for this version and dropped in 4 (a
# report's ``kind`` is the session's: "slowdown", "hang", ...); ``summary`` and ``sentence`` are kept too.
REPORT_SCHEMA_VERSION = 3
_READABLE_VERSIONS = (1, 2, 3)


@dataclass(frozen=True)
class Box:
    """An expected range R_f = [β_lo,β_hi] × [μ_lo,μ_hi] × [σ_lo,σ_hi]."""

    lo: Triple
    hi: Triple

    def to_dict(self) -> dict[str, Any]:
        return {"lo": self.lo.to_dict(), "hi": self.hi.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "box") -> Box:
        return cls(Triple.from_dict(require(d, "lo", dict, where)), Triple.from_dict(require(d, "hi", dict, where)))


@dataclass(frozen=True)
class Wait:
    """Peers that wait for a finding's ranks: in which collective, and how much of the window."""

    function: str  # the collective's label
    ranks: tuple[int, ...]  # the waiting ranks
    share: float  # median share of the window the waiting ranks spend waiting for the culprit

    def to_dict(self) -> dict[str, Any]:
        return {"function": self.function, "ranks": list(self.ranks), "share": rounded(self.share)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Wait:
        where = "Wait"
        return cls(function=require(d, "function", str, where),
                   ranks=int_items(require(d, "ranks", list, where), f"{where}.ranks"),
                   share=float(require(d, "share", float, where)))


@dataclass(frozen=True)
class Finding:
    """One abnormal function and the workers on which it is abnormal."""

    key: str
    label: str
    category: Category
    ranks: tuple[int, ...]
    kind: str  # "common" (most workers) | "specific" (a few) | "random" (scattered per-worker pattern)
    tests: tuple[str, ...]  # which test fired: "expectation", "differential"
    observed: Triple  # median pattern over the abnormal ranks
    median: Triple  # median pattern over all workers
    expected: Box
    sentence: str
    points: tuple[tuple[int, float, float], ...] = ()  # (rank, β, μ) of all (or sampled) workers, for plots
    impact: float = 0.0  # estimated cost to the step, as a share of the window (own excess + induced waits)
    impact_s: float = 0.0  # the same in seconds of the window
    waits: tuple[Wait, ...] = ()  # peers that wait for these ranks (folded victims)
    parts: tuple[tuple[str, float], ...] = ()  # (label, median β) of the functions a grouped finding holds
    # what fixing the cause would save, as a share of the window and in seconds: an estimate
    # (docs/diagnosis.md, "What fixing it would save"); 0 where none is made
    saves_share: float = 0.0
    saves_s: float = 0.0
    # how the saving was found: "replayed over N steps", or "an estimate" (with why the replay was
    # inconclusive, where it was tried); "" where none is made
    saves_basis: str = ""
    # issue 32: a plain-words headline (at most 120 characters), one fact per evidence line, what to
    # check next, and the cause kind they were chosen by ("load_imbalance", "host_bound", ...)
    title: str = ""
    evidence: tuple[str, ...] = ()
    next_steps: tuple[str, ...] = ()
    cause: str = ""

    @property
    def headline(self) -> str:
        """The title, or the sentence of a finding read from a version 1 report."""
        return self.title or self.sentence

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "cause": self.cause,
            "evidence": list(self.evidence),
            "next_steps": list(self.next_steps),
            "key": self.key,
            "label": self.label,
            "category": self.category.value,
            "ranks": list(self.ranks),
            "kind": self.kind,  # kept for schema version 3: ``spread`` says it (dropped in 4)
            "spread": self.kind,
            "tests": list(self.tests),
            "observed": self.observed.to_dict(),
            "median": self.median.to_dict(),
            "expected": self.expected.to_dict(),
            "sentence": self.sentence,
            "points": [list(p) for p in self.points],
            "impact": rounded(self.impact),
            "impact_s": rounded(self.impact_s),
            "waits": [w.to_dict() for w in self.waits],
            "parts": [[label, rounded(b)] for label, b in self.parts],
            **({"saves_share": rounded(self.saves_share), "saves_s": rounded(self.saves_s),
                "saves_basis": self.saves_basis} if self.saves_share else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Finding:
        where = "Finding"
        return cls(
            key=require(d, "key", str, where),
            label=require(d, "label", str, where),
            category=parse_category(require(d, "category", str, where), where),
            ranks=int_items(require(d, "ranks", list, where), f"{where}.ranks"),
            kind=require(d, "kind", str, where),
            tests=tuple(str(t) for t in require(d, "tests", list, where)),
            observed=Triple.from_dict(require(d, "observed", dict, where)),
            median=Triple.from_dict(require(d, "median", dict, where)),
            expected=Box.from_dict(require(d, "expected", dict, where)),
            sentence=require(d, "sentence", str, where),
            points=tuple(_point(p, f"{where}.points[{i}]")
                         for i, p in enumerate(optional(d, "points", list, where, []))),
            impact=float(optional(d, "impact", float, where, 0.0)),
            impact_s=float(optional(d, "impact_s", float, where, 0.0)),
            waits=tuple(Wait.from_dict(w) for w in optional(d, "waits", list, where, [])),
            parts=tuple(_part(p, f"{where}.parts[{i}]") for i, p in enumerate(optional(d, "parts", list, where, []))),
            saves_share=float(optional(d, "saves_share", float, where, 0.0)),
            saves_s=float(optional(d, "saves_s", float, where, 0.0)),
            saves_basis=optional(d, "saves_basis", str, where, ""),
            title=optional(d, "title", str, where, ""),
            evidence=_strings(optional(d, "evidence", list, where, []), f"{where}.evidence"),
            next_steps=_strings(optional(d, "next_steps", list, where, []), f"{where}.next_steps"),
            cause=optional(d, "cause", str, where, ""),
        )


@dataclass(frozen=True)
class Lane:
    """One rank's representative step in the report's step picture: how long the step takes and
    how it divides into parts, in the order drawn. ``parts``: (part, ms) with part one of
    ``LANE_PARTS``; a share of the window's critical path, scaled to the step, not a timeline."""

    rank: int
    role: str  # "culprit", "waits", "stage 1", ...
    step_ms: float
    parts: tuple[tuple[str, float], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "role": self.role, "step_ms": rounded(self.step_ms),
                "parts": [[name, rounded(ms)] for name, ms in self.parts]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Lane:
        where = "Lane"
        parts = []
        for i, p in enumerate(require(d, "parts", list, where)):
            if not isinstance(p, list) or len(p) != 2 or p[0] not in LANE_PARTS:
                raise SchemaError(f"{where}.parts[{i}]: expected [one of {', '.join(LANE_PARTS)}, ms], got {p!r:.80}")
            parts.append((str(p[0]), float_items(p[1:], f"{where}.parts[{i}]", first=1)[0]))
        return cls(rank=require(d, "rank", int, where), role=require(d, "role", str, where),
                   step_ms=float(require(d, "step_ms", float, where)), parts=tuple(parts))


@dataclass(frozen=True)
class JointSaving:
    """What fixing every cause the report replayed at once would save: several culprits hold one
    another up (a step waits for the latest), so their findings' savings do not add (issue 28)."""

    ranks: tuple[int, ...]
    saves_share: float  # of the step
    saves_s: float  # of the window
    basis: str  # "replayed over N steps"

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "saves_share": rounded(self.saves_share),
                "saves_s": rounded(self.saves_s), "basis": self.basis}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JointSaving:
        where = "JointSaving"
        return cls(ranks=int_items(require(d, "ranks", list, where), f"{where}.ranks"),
                   saves_share=float(require(d, "saves_share", float, where)),
                   saves_s=float(require(d, "saves_s", float, where)), basis=require(d, "basis", str, where))


# the parts of a step, in the order a lane draws them
LANE_PARTS = ("host", "compute", "waiting", "communication", "other")


@dataclass(frozen=True)
class TopFunction:
    """A function high on the critical path (shown when nothing is abnormal)."""

    key: str
    label: str
    category: Category
    median: Triple

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "category": self.category.value, "median": self.median.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TopFunction:
        where = "TopFunction"
        return cls(
            require(d, "key", str, where),
            require(d, "label", str, where),
            parse_category(require(d, "category", str, where), where),
            Triple.from_dict(require(d, "median", dict, where)),
        )


@dataclass(frozen=True)
class RankState:
    """One rank's state in a hang report."""

    rank: int
    state: str  # "culprit" | "waiting" | "silent" | "paused" | "ok"
    where: str  # "perftracker/examples/train.py:88 in forward (time.sleep)" or "c10d allreduce"
    signature: str = ""
    idle_s: float = 0.0
    last_iteration: int = -1
    detail: str = ""  # e.g. "process stopped", "process dead"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "state": self.state,
            "where": self.where,
            "signature": self.signature,
            "idle_s": self.idle_s,
            "last_iteration": self.last_iteration,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RankState:
        where = "RankState"
        return cls(
            rank=require(d, "rank", int, where),
            state=require(d, "state", str, where),
            where=require(d, "where", str, where),
            signature=optional(d, "signature", str, where, ""),
            idle_s=optional(d, "idle_s", float, where, 0.0),
            last_iteration=optional(d, "last_iteration", int, where, -1),
            detail=optional(d, "detail", str, where, ""),
        )


@dataclass(frozen=True)
class Report:
    """A localizer's verdict for one session. ``kind`` is "slowdown" or "hang"."""

    job: str
    session: str
    kind: str
    created_ns: int  # wall clock
    trigger_reason: str
    window_s: float
    ranks_reported: tuple[int, ...]
    ranks_missing: tuple[int, ...] = ()
    findings: tuple[Finding, ...] = ()
    top_functions: tuple[TopFunction, ...] = ()
    hang_states: tuple[RankState, ...] = ()
    summary: str = ""  # one plain sentence for the whole report
    profile: str = ""  # expected-range profile used: "gpu" | "cpu" | a file name
    iteration_ms: Mapping[int, tuple[float, ...]] = field(default_factory=dict)  # rank -> series around the trigger
    status: str = "complete"  # "complete" | "partial" | "resolved"
    schema_version: int = REPORT_SCHEMA_VERSION
    headline: str = ""  # at most 120 characters: the first finding's title, "(+N more)"
    step_lanes: tuple[Lane, ...] = ()  # one representative step of a few ranks, for the step picture
    # which level of diagnosis the report came from (issue 30): "window" (a profile window),
    # "first look" (the hooks' phase times, no window), "snapshot" (a hang's stacks), "exit" (a
    # crash), "traces" (offline traces); "" derives it from ``kind`` (``diagnosis_level``)
    level: str = ""
    # what the window cost the training job and the budget it spends from (issue 30; the workers'
    # WINDOW_COST_KEYS, the worst rank's): empty when no worker sent it
    window_cost: Mapping[str, float] = field(default_factory=dict)
    saves_together: JointSaving | None = None  # fixing every replayed cause at once, where there are several
    # the comparison with the job's healthy baseline (issue 49); None: not made (offline, hang, crash)
    since_fast: SinceFast | None = None
    # the detection that opened the session, typed (perftracker/model/trigger.py); None for a manual
    # trigger from the CLI, a hang, a crash or offline traces: ``trigger_reason`` says what it was
    trigger: Detection | None = None

    @property
    def samples_measured(self) -> bool:
        """Whether μ and σ were measured (offline traces: only with sample files beside them)."""
        pairs = [(t.mu, t.sigma) for f in self.findings for t in (f.observed, f.median)]
        return samples_measured(self.kind, pairs + [(t.median.mu, t.median.sigma) for t in self.top_functions])

    @property
    def diagnosis_level(self) -> str:
        return self.level or _LEVELS.get(self.kind, "window")

    @property
    def top_line(self) -> str:
        """What a reader sees first: the headline, or the summary of a version 1 report."""
        return self.headline or self.summary

    def to_dict(self) -> dict[str, Any]:
        d = self._dict()
        return d if self.samples_measured else dict(unmeasured_to_null(d))

    def _dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "job": self.job,
            "session": self.session,
            "kind": self.kind,
            "status": self.status,
            "created_ns": self.created_ns,
            "trigger_reason": self.trigger_reason,
            "window_s": self.window_s,
            "profile": self.profile,
            "summary": self.summary,
            "ranks_reported": list(self.ranks_reported),
            "ranks_missing": list(self.ranks_missing),
            "findings": [f.to_dict() for f in self.findings],
            "top_functions": [t.to_dict() for t in self.top_functions],
            "hang_states": [s.to_dict() for s in self.hang_states],
            "iteration_ms": {str(k): [rounded(x) for x in v] for k, v in self.iteration_ms.items()},
            "headline": self.headline,
            "step_lanes": [lane.to_dict() for lane in self.step_lanes],
            "level": self.diagnosis_level,
            "window_cost": {k: rounded(v) for k, v in self.window_cost.items()},
            **({"saves_together": self.saves_together.to_dict()} if self.saves_together is not None else {}),
            **({"since_fast": self.since_fast.to_dict()} if self.since_fast is not None else {}),
            **({"trigger": self.trigger.to_dict()} if self.trigger is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        where = "Report"
        check_schema_version(d, where, _READABLE_VERSIONS)
        d = null_to_zero(d)  # μ, σ not measured: null in version 3, 0.0 in a Report  # a version 1 report is read as version 2
        return cls(
            headline=optional(d, "headline", str, where, ""),
            step_lanes=tuple(Lane.from_dict(x) for x in optional(d, "step_lanes", list, where, [])),
            job=require(d, "job", str, where),
            session=require(d, "session", str, where),
            kind=require(d, "kind", str, where),
            status=optional(d, "status", str, where, "complete"),
            created_ns=require(d, "created_ns", int, where),
            trigger_reason=require(d, "trigger_reason", str, where),
            window_s=require(d, "window_s", float, where),
            profile=optional(d, "profile", str, where, ""),
            summary=optional(d, "summary", str, where, ""),
            ranks_reported=int_items(require(d, "ranks_reported", list, where), f"{where}.ranks_reported"),
            ranks_missing=int_items(optional(d, "ranks_missing", list, where, []), f"{where}.ranks_missing"),
            findings=tuple(Finding.from_dict(f) for f in optional(d, "findings", list, where, [])),
            top_functions=tuple(TopFunction.from_dict(t) for t in optional(d, "top_functions", list, where, [])),
            hang_states=tuple(RankState.from_dict(s) for s in optional(d, "hang_states", list, where, [])),
            iteration_ms=_series(optional(d, "iteration_ms", dict, where, {}), f"{where}.iteration_ms"),
            level=_stored_level(optional(d, "level", str, where, ""), require(d, "kind", str, where)),
            window_cost=window_cost_fields(optional(d, "window_cost", dict, where, {}), f"{where}.window_cost"),
            saves_together=_joint(optional(d, "saves_together", dict, where, {})),
            since_fast=_since_fast(optional(d, "since_fast", dict, where, {})),
            trigger=_detection(optional(d, "trigger", dict, where, {})),
        )


_LEVELS = {"slowdown": "window", "hang": "snapshot", "crash": "exit", "offline": "traces"}


def _stored_level(level: str, kind: str) -> str:
    """The level field as read: "" when it is the one ``kind`` implies (a report reads back equal)."""
    return "" if level == _LEVELS.get(kind, "window") else level


def _since_fast(d: Mapping[str, Any]) -> SinceFast | None:
    return SinceFast.from_dict(d) if d else None


def _detection(d: Mapping[str, Any]) -> Detection | None:
    return Detection.from_dict(d, "Report.trigger") if d else None


def _joint(d: Mapping[str, Any]) -> JointSaving | None:
    return JointSaving.from_dict(d) if d else None


def _strings(values: Sequence[Any], where: str) -> tuple[str, ...]:
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise SchemaError(f"{where}[{i}]: expected a string, got {v!r:.80}")
    return tuple(values)


def _point(p: Any, where: str) -> tuple[int, float, float]:
    """A finding's scatter point: [rank, β, μ]."""
    if not isinstance(p, list) or len(p) != 3:
        raise SchemaError(f"{where}: expected [rank, beta, mu], got {p!r:.80}")
    (rank,) = int_items(p[:1], where)
    beta, mu = float_items(p[1:], where, first=1)
    return rank, beta, mu


def _part(p: Any, where: str) -> tuple[str, float]:
    """A grouped finding's part: [label, median β]."""
    if not isinstance(p, list) or len(p) != 2 or not isinstance(p[0], str):
        raise SchemaError(f"{where}: expected [label, beta], got {p!r:.80}")
    return p[0], float_items(p[1:], where, first=1)[0]


def _series(d: Mapping[str, Any], where: str) -> dict[int, tuple[float, ...]]:
    """``iteration_ms``: {"rank": [ms, ...]} with integer keys and finite numbers."""
    out: dict[int, tuple[float, ...]] = {}
    for k, v in d.items():
        if not isinstance(k, str) or not k.isdigit() or not k.isascii() or not isinstance(v, list):
            raise SchemaError(f"{where}: expected {{rank: [milliseconds, ...]}}, got {k!r:.40}: {v!r:.40}")
        out[int(k)] = float_items(v, f"{where}[{k}]")
    return out


def compress_ranks(ranks: Sequence[int]) -> str:
    """[0,1,2,3,7,9,10] -> "0-3,7,9-10"."""
    if len(ranks) > 4096:  # a million ranks: the runs found with numpy (issue 45), the same text
        return _compress_many(ranks)
    return _runs_text(sorted(set(int(r) for r in ranks)))


def _runs_text(rs: list[int]) -> str:
    """Sorted unique ranks -> "0-3,7,9-10"."""
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def _compress_many(ranks: Sequence[int]) -> str:
    import numpy as np  # only here: the model stays light to import

    try:
        a = np.asarray(ranks, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):  # not int64s: the plain way
        a = None
    if a is None or a.ndim != 1:
        return _runs_text(sorted(set(int(r) for r in ranks)))
    if a.size and not bool(np.all(a[1:] > a[:-1])):  # not already sorted and distinct (the usual case)
        a = np.sort(a)
        a = a[np.concatenate(([True], a[1:] != a[:-1]))]
    breaks = np.flatnonzero(np.diff(a) != 1) + 1
    firsts = a[np.concatenate(([0], breaks))].tolist()
    lasts = a[np.concatenate((breaks - 1, [a.size - 1]))].tolist()
    return ",".join(str(f) if f == g else f"{f}-{g}" for f, g in zip(firsts, lasts, strict=True))
