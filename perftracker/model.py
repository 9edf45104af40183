"""The pure data model: frozen dataclasses with to_dict / from_dict and schema_version. No I/O.

Objects that cross a process or network boundary (PatternSet, HangSnapshot, Report) carry
``schema_version``. ``from_dict`` raises SchemaError on a wrong or unknown version or a bad shape,
with a message that names the field.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from perftracker.errors import SchemaError

SCHEMA_VERSION = 1


class Category(str, Enum):
    """Function categories, in critical-path priority order (highest first)."""

    COMPUTE = "compute"
    MEMORY = "memory"
    COLLECTIVE = "collective"
    PYTHON = "python"

    @property
    def priority(self) -> int:
        """0 is highest."""
        return _PRIORITY[self]


_PRIORITY = {Category.COMPUTE: 0, Category.MEMORY: 1, Category.COLLECTIVE: 2, Category.PYTHON: 3}


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------


def _req(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where}: expected an object, got {type(d).__name__}")
    if key not in d:
        raise SchemaError(f"{where}: missing field {key!r}")
    value = d[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        raise SchemaError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, got {value!r:.80}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaError(f"{where}.{key}: not a finite number: {value!r}")
    return value


def _opt(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any) -> Any:
    if d.get(key) is None:
        return default
    return _req(d, key, kind, where)


def check_schema_version(d: Mapping[str, Any], where: str) -> None:
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where}: expected an object, got {type(d).__name__}")
    version = d.get("schema_version")
    if version is None:
        raise SchemaError(f"{where}: missing schema_version (expected {SCHEMA_VERSION})")
    if version != SCHEMA_VERSION:
        raise SchemaError(
            f"{where}: unsupported schema_version {version!r} (this perftracker reads {SCHEMA_VERSION})"
        )


def _category(value: Any, where: str) -> Category:
    try:
        return Category(value)
    except ValueError:
        raise SchemaError(f"{where}: unknown category {value!r}") from None


# --------------------------------------------------------------------------------------------
# patterns
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Triple:
    """(β, μ, σ)."""

    beta: float
    mu: float
    sigma: float

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.beta, self.mu, self.sigma)

    def to_dict(self) -> dict[str, float]:
        return {"beta": self.beta, "mu": self.mu, "sigma": self.sigma}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "triple") -> Triple:
        return cls(_req(d, "beta", float, where), _req(d, "mu", float, where), _req(d, "sigma", float, where))


@dataclass(frozen=True)
class Pattern:
    """The behavior pattern of one function on one worker over one window.

    ``key`` is the function identity: for Python functions the whole call stack, frames joined by
    ``;`` outermost first; for kernels and operators the name. ``label`` is a short display name
    (the leaf frame or the op name).
    """

    key: str
    category: Category
    beta: float  # share of the window this function held the critical path, in [0, 1]
    mu: float  # mean utilization of its resource over critical execution durations, [0, 1]
    sigma: float  # weighted std of utilization, [0, 1]
    label: str = ""
    executions: int = 0
    critical_ns: int = 0  # sum of c_e
    resource: str = ""  # which utilization series μ/σ came from ("cpu", "sm", "pcie", "nic", ...); "" if none

    @property
    def triple(self) -> Triple:
        return Triple(self.beta, self.mu, self.sigma)


@dataclass(frozen=True)
class PatternSet:
    """One worker's patterns for one session, plus its identity."""

    job: str
    session: str
    rank: int
    world_size: int
    host: str
    window_start_ns: int
    window_end_ns: int
    patterns: tuple[Pattern, ...]
    local_rank: int = -1
    pid: int = 0
    coords: Mapping[str, int] = field(default_factory=dict)  # parallel coordinates, e.g. {"dp": 3, "tp": 1}
    source: str = "online"  # "online" | "kineto"
    gpu: bool = False  # whether the window had GPU activity (selects the expected-range profile)
    iteration_ms: tuple[float, ...] = ()  # iteration durations around the window, for the report
    schema_version: int = SCHEMA_VERSION

    @property
    def window_s(self) -> float:
        return (self.window_end_ns - self.window_start_ns) / 1e9

    def to_dict(self) -> dict[str, Any]:
        """A compact dict: Python stacks share one frame table."""
        frames: dict[str, int] = {}
        rows = []
        for p in self.patterns:
            if p.category is Category.PYTHON:
                key: Any = [frames.setdefault(fr, len(frames)) for fr in p.key.split(";")]
            else:
                key = p.key
            rows.append(
                [key, p.category.value, _r(p.beta), _r(p.mu), _r(p.sigma), p.label if p.label != p.key else "",
                 p.executions, p.critical_ns, p.resource]
            )
        return {
            "schema_version": self.schema_version,
            "job": self.job,
            "session": self.session,
            "rank": self.rank,
            "world_size": self.world_size,
            "host": self.host,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "coords": dict(self.coords),
            "source": self.source,
            "gpu": self.gpu,
            "window_start_ns": self.window_start_ns,
            "window_end_ns": self.window_end_ns,
            "iteration_ms": [_r(x) for x in self.iteration_ms],
            "frames": list(frames),
            "patterns": rows,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PatternSet:
        where = "PatternSet"
        check_schema_version(d, where)
        frames = _opt(d, "frames", list, where, [])
        rows = _req(d, "patterns", list, where)
        patterns = []
        lo, hi = -1e-9, 1 + 1e-9
        for i, row in enumerate(rows):
            # Fast path for the well-formed row (the common case): exact types, so that it accepts
            # only what _pattern_from_row accepts and builds the same Pattern. Anything else goes
            # through _pattern_from_row, which does every check and names the field.
            if type(row) is list and len(row) == 9:
                key, cat, beta, mu, sigma, label, n, crit_ns, resource = row
                category = _CATEGORIES.get(cat) if type(cat) is str else None
                if type(key) is list:
                    try:
                        key = ";".join([frames[j] for j in key])
                    except (IndexError, TypeError):
                        key = None
                if (category is not None and type(key) is str and key
                        and type(beta) is float and lo <= beta <= hi
                        and type(mu) is float and lo <= mu <= hi
                        and type(sigma) is float and lo <= sigma <= hi
                        and type(n) is int and type(crit_ns) is int):
                    patterns.append(Pattern(key, category, beta, mu, sigma, str(label or key.rsplit(";", 1)[-1]),
                                            n, crit_ns, str(resource or "")))
                    continue
            patterns.append(_pattern_from_row(row, frames, f"{where}.patterns[{i}]"))
        coords = _opt(d, "coords", dict, where, {})
        return cls(
            job=_req(d, "job", str, where),
            session=_req(d, "session", str, where),
            rank=_req(d, "rank", int, where),
            world_size=_req(d, "world_size", int, where),
            host=_req(d, "host", str, where),
            window_start_ns=_req(d, "window_start_ns", int, where),
            window_end_ns=_req(d, "window_end_ns", int, where),
            patterns=tuple(patterns),
            local_rank=_opt(d, "local_rank", int, where, -1),
            pid=_opt(d, "pid", int, where, 0),
            coords={str(k): int(v) for k, v in coords.items()},
            source=_opt(d, "source", str, where, "online"),
            gpu=_opt(d, "gpu", bool, where, False),
            iteration_ms=tuple(float(x) for x in _opt(d, "iteration_ms", list, where, [])),
        )

    def to_bytes(self) -> bytes:
        """The compact wire/storage form: zlib-compressed JSON of to_dict()."""
        return zlib.compress(json.dumps(self.to_dict(), separators=(",", ":")).encode(), 6)

    @classmethod
    def from_bytes(cls, data: bytes) -> PatternSet:
        try:
            d = json.loads(zlib.decompress(data))
        except (zlib.error, ValueError) as exc:
            raise SchemaError(f"PatternSet: not a compressed JSON document ({exc})") from None
        return cls.from_dict(d)


_CATEGORIES = {c.value: c for c in Category}


def _pattern_from_row(row: Any, frames: list[Any], w: str) -> Pattern:
    """One row of ``PatternSet.to_dict()["patterns"]``, with every check; SchemaError names the field."""
    if not isinstance(row, list) or len(row) != 9:
        raise SchemaError(f"{w}: expected a list of 9 fields")
    key, cat, beta, mu, sigma, label, n, crit_ns, resource = row
    category = _category(cat, w)
    if isinstance(key, list):
        try:
            key = ";".join(frames[int(j)] for j in key)
        except (IndexError, ValueError, TypeError):
            raise SchemaError(f"{w}: bad frame index in stack") from None
    if not isinstance(key, str) or not key:
        raise SchemaError(f"{w}: function key must be a non-empty string")
    vals = []
    for name, v in (("beta", beta), ("mu", mu), ("sigma", sigma)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SchemaError(f"{w}.{name}: not a finite number: {v!r}")
        if not -1e-9 <= v <= 1 + 1e-9:
            raise SchemaError(f"{w}.{name}: {v!r} outside [0, 1]")
        vals.append(float(v))
    if not isinstance(n, int) or not isinstance(crit_ns, int):
        raise SchemaError(f"{w}: executions and critical_ns must be integers")
    return Pattern(key, category, vals[0], vals[1], vals[2], str(label or key.rsplit(";", 1)[-1]),
                   n, crit_ns, str(resource or ""))


def _r(x: float) -> float:
    """Round for storage: 6 significant decimals is far below measurement noise."""
    return round(float(x), 6)


# --------------------------------------------------------------------------------------------
# hang snapshots
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class HangSnapshot:
    """What a blocked worker's controller thread saw. ``stack`` is outermost first."""

    job: str
    rank: int
    world_size: int
    host: str
    pid: int
    taken_ns: int  # wall-clock ns (time.time_ns) when the snapshot was taken
    last_iteration: int  # last completed iteration
    idle_s: float  # time since the last hook event
    stack: tuple[Frame, ...]
    current_op: str = ""  # innermost torch op / collective in progress, if known
    last_event: str = ""  # kind of the last hook event ("dataloader.next", "optimizer.step", ...)
    session: str = ""
    schema_version: int = SCHEMA_VERSION
    # the blocked thread's kernel state from procfs, "<state letter> <wchan>", e.g.
    # "S futex_do_wait" (waiting on a lock/condition, e.g. a gloo work), "S hrtimer_nanosleep", "R"
    kernel_state: str = ""
    # set when the snapshot was taken at exit, from the exception that ended the training thread
    # (e.g. "RuntimeError: ... Connection reset by peer"): the stack is the exception's traceback
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "job": self.job,
            "rank": self.rank,
            "world_size": self.world_size,
            "host": self.host,
            "pid": self.pid,
            "taken_ns": self.taken_ns,
            "last_iteration": self.last_iteration,
            "idle_s": self.idle_s,
            "stack": [[f.file, f.line, f.function] for f in self.stack],
            "current_op": self.current_op,
            "last_event": self.last_event,
            "session": self.session,
            "kernel_state": self.kernel_state,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HangSnapshot:
        where = "HangSnapshot"
        check_schema_version(d, where)
        stack = []
        for i, fr in enumerate(_req(d, "stack", list, where)):
            if not (isinstance(fr, list) and len(fr) == 3 and isinstance(fr[1], int)):
                raise SchemaError(f"{where}.stack[{i}]: expected [file, line, function]")
            stack.append(Frame(str(fr[0]), fr[1], str(fr[2])))
        return cls(
            job=_req(d, "job", str, where),
            rank=_req(d, "rank", int, where),
            world_size=_req(d, "world_size", int, where),
            host=_req(d, "host", str, where),
            pid=_req(d, "pid", int, where),
            taken_ns=_req(d, "taken_ns", int, where),
            last_iteration=_req(d, "last_iteration", int, where),
            idle_s=_req(d, "idle_s", float, where),
            stack=tuple(stack),
            current_op=_opt(d, "current_op", str, where, ""),
            last_event=_opt(d, "last_event", str, where, ""),
            session=_opt(d, "session", str, where, ""),
            kernel_state=_opt(d, "kernel_state", str, where, ""),
            error=_opt(d, "error", str, where, ""),
        )


# --------------------------------------------------------------------------------------------
# reports
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """An expected range R_f = [β_lo,β_hi] × [μ_lo,μ_hi] × [σ_lo,σ_hi]."""

    lo: Triple
    hi: Triple

    def to_dict(self) -> dict[str, Any]:
        return {"lo": self.lo.to_dict(), "hi": self.hi.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "box") -> Box:
        return cls(Triple.from_dict(_req(d, "lo", dict, where)), Triple.from_dict(_req(d, "hi", dict, where)))


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "category": self.category.value,
            "ranks": list(self.ranks),
            "kind": self.kind,
            "tests": list(self.tests),
            "observed": self.observed.to_dict(),
            "median": self.median.to_dict(),
            "expected": self.expected.to_dict(),
            "sentence": self.sentence,
            "points": [list(p) for p in self.points],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Finding:
        where = "Finding"
        return cls(
            key=_req(d, "key", str, where),
            label=_req(d, "label", str, where),
            category=_category(_req(d, "category", str, where), where),
            ranks=tuple(int(r) for r in _req(d, "ranks", list, where)),
            kind=_req(d, "kind", str, where),
            tests=tuple(str(t) for t in _req(d, "tests", list, where)),
            observed=Triple.from_dict(_req(d, "observed", dict, where)),
            median=Triple.from_dict(_req(d, "median", dict, where)),
            expected=Box.from_dict(_req(d, "expected", dict, where)),
            sentence=_req(d, "sentence", str, where),
            points=tuple((int(p[0]), float(p[1]), float(p[2])) for p in _opt(d, "points", list, where, [])),
        )


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
            _req(d, "key", str, where),
            _req(d, "label", str, where),
            _category(_req(d, "category", str, where), where),
            Triple.from_dict(_req(d, "median", dict, where)),
        )


@dataclass(frozen=True)
class RankState:
    """One rank's state in a hang report."""

    rank: int
    state: str  # "culprit" | "waiting" | "silent" | "paused" | "ok"
    where: str  # "examples/train.py:88 in forward (time.sleep)" or "c10d allreduce"
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
            rank=_req(d, "rank", int, where),
            state=_req(d, "state", str, where),
            where=_req(d, "where", str, where),
            signature=_opt(d, "signature", str, where, ""),
            idle_s=_opt(d, "idle_s", float, where, 0.0),
            last_iteration=_opt(d, "last_iteration", int, where, -1),
            detail=_opt(d, "detail", str, where, ""),
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
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
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
            "iteration_ms": {str(k): [_r(x) for x in v] for k, v in self.iteration_ms.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        where = "Report"
        check_schema_version(d, where)
        return cls(
            job=_req(d, "job", str, where),
            session=_req(d, "session", str, where),
            kind=_req(d, "kind", str, where),
            status=_opt(d, "status", str, where, "complete"),
            created_ns=_req(d, "created_ns", int, where),
            trigger_reason=_req(d, "trigger_reason", str, where),
            window_s=_req(d, "window_s", float, where),
            profile=_opt(d, "profile", str, where, ""),
            summary=_opt(d, "summary", str, where, ""),
            ranks_reported=tuple(int(r) for r in _req(d, "ranks_reported", list, where)),
            ranks_missing=tuple(int(r) for r in _opt(d, "ranks_missing", list, where, [])),
            findings=tuple(Finding.from_dict(f) for f in _opt(d, "findings", list, where, [])),
            top_functions=tuple(TopFunction.from_dict(t) for t in _opt(d, "top_functions", list, where, [])),
            hang_states=tuple(RankState.from_dict(s) for s in _opt(d, "hang_states", list, where, [])),
            iteration_ms={int(k): tuple(float(x) for x in v) for k, v in _opt(d, "iteration_ms", dict, where, {}).items()},
        )


def compress_ranks(ranks: Sequence[int]) -> str:
    """[0,1,2,3,7,9,10] -> "0-3,7,9-10"."""
    rs = sorted(set(int(r) for r in ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)
