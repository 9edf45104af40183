"""Behavior patterns: the function categories, (β, μ, σ) triples, one worker's PatternSet. No I/O.

Import these from ``perftracker.model`` (the public path); this module holds them.
"""

from __future__ import annotations

import json
import logging
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from perftracker.errors import SchemaError
from perftracker.model.schema import (
    SCHEMA_VERSION,
    check_schema_version,
    optional,
    require,
    rounded,
)
from perftracker.model.step_record import RecordVersionError, StepRecord
from perftracker.model.window_cost import window_cost_fields
from perftracker.warnonce import WarnOnce

log = logging.getLogger(__name__)
_warn_once = WarnOnce(log)


class Category(StrEnum):
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


def parse_category(value: Any, where: str) -> Category:
    try:
        return Category(value)
    except ValueError:
        raise SchemaError(f"{where}: unknown category {value!r}") from None


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
        return cls(require(d, "beta", float, where), require(d, "mu", float, where), require(d, "sigma", float, where))


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


# The host link's health pattern (agent/samplers/tcp.py): μ is the share of TCP segments retransmitted,
# not a utilization. The summarizer writes it; renderers label its μ by it.
LINK_KEY = "TCP retransmissions (host link)"


@dataclass(frozen=True)
class ProcessGroup:
    """One process group a worker belongs to, as its trace (or torch.distributed) describes it.

    ``name`` is the group's unique name (``pg_name``), ``desc`` what it is for
    (``DATA_PARALLEL_GROUP``, ``PIPELINE_MODEL_PARALLEL_GROUP``, "" when unknown), ``ranks`` its
    members in the group's own order (global ranks), ``p2p`` whether the worker sent or received
    point-to-point in it (pipeline send/recv)."""

    name: str
    desc: str
    ranks: Sequence[int]  # a tuple; a range for a large group continued from a cut list (agent/kineto.py)
    p2p: bool = False

    def to_list(self) -> list[Any]:
        return [self.name, self.desc, encode_ranks(self.ranks), self.p2p]

    @classmethod
    def from_list(cls, row: Any, where: str) -> ProcessGroup:
        if not isinstance(row, list) or len(row) != 4 or not isinstance(row[0], str) or not isinstance(row[1], str) \
                or not isinstance(row[3], bool):
            raise SchemaError(f"{where}: expected [name, desc, ranks, p2p]")
        return cls(row[0], row[1], decode_ranks(row[2], where), row[3])


_MAX_GROUP_RANKS = 10_000_000
# a group of more members than this that is an arithmetic run is kept as a ``range`` (issue 46: a
# 10 KB trace or a few bytes of JSON declaring 9,999,999 members took gigabytes as tuples)
RANGE_MIN = 4096


def encode_ranks(ranks: Sequence[int]) -> Any:
    """Ranks as ``{"start", "stop", "step"}`` when they are an arithmetic run of at least 3 (a
    data-parallel group of 32 ranks in 3 numbers), else as a list."""
    if isinstance(ranks, range) and len(ranks) >= 3 and ranks.step > 0:  # without walking it
        return {"start": ranks.start, "stop": ranks[-1] + ranks.step, "step": ranks.step}
    if len(ranks) >= 3:
        step = ranks[1] - ranks[0]
        if step > 0 and all(b - a == step for a, b in zip(ranks, ranks[1:], strict=False)):
            return {"start": ranks[0], "stop": ranks[-1] + step, "step": step}
    return list(ranks)


def decode_ranks(v: Any, where: str) -> Sequence[int]:
    if isinstance(v, Mapping):
        start, stop, step = (require(v, k, int, where) for k in ("start", "stop", "step"))
        if step <= 0 or start < 0 or stop > _MAX_GROUP_RANKS + step or (stop - start) // step > _MAX_GROUP_RANKS:
            raise SchemaError(f"{where}: bad rank range {start}:{stop}:{step}")
        run = range(start, stop, step)
        return run if len(run) > RANGE_MIN else tuple(run)
    if not isinstance(v, list) or len(v) > _MAX_GROUP_RANKS:
        raise SchemaError(f"{where}: ranks must be a list or a range")
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise SchemaError(f"{where}: not a rank: {x!r:.40}")
    return tuple(v)


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
    groups: tuple[ProcessGroup, ...] = ()  # the process groups this worker belongs to (empty: not known)
    comm: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # collective function key -> group names
    steps_ms: tuple[float, ...] = ()  # compute time per step (between the step group's collectives), ms
    step_group: str = ""  # the group whose collective instances cut the steps ("" : iteration marks)
    # the collective instances of the last steps, for the replay of what fixing a culprit saves
    step_record: StepRecord | None = None
    # what the window cost this worker and its budget (perftracker.model.window_cost; issue 30)
    window_cost: Mapping[str, float] = field(default_factory=dict)
    # where the training thread may run: its cgroup and allowed CPUs, "<cgroup>|<Cpus_allowed_list>"
    # ("" unknown); ranks of one host with the same place share their cores (issue 31)
    cpu_place: str = ""
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
                [key, p.category.value, rounded(p.beta), rounded(p.mu), rounded(p.sigma), p.label if p.label != p.key else "",
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
            "iteration_ms": [rounded(x) for x in self.iteration_ms],
            "frames": list(frames),
            "patterns": rows,
            **self._groups_dict(),
            **({"window_cost": dict(self.window_cost)} if self.window_cost else {}),
            **({"cpu_place": self.cpu_place} if self.cpu_place else {}),
        }

    def _groups_dict(self) -> dict[str, Any]:
        return groups_fields_dict(self.groups, self.comm, self.steps_ms, self.step_group, self.step_record)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PatternSet:
        where = "PatternSet"
        check_schema_version(d, where)
        frames = optional(d, "frames", list, where, [])
        rows = require(d, "patterns", list, where)
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
        coords = optional(d, "coords", dict, where, {})
        return cls(
            job=require(d, "job", str, where),
            session=require(d, "session", str, where),
            rank=require(d, "rank", int, where),
            world_size=require(d, "world_size", int, where),
            host=require(d, "host", str, where),
            window_start_ns=require(d, "window_start_ns", int, where),
            window_end_ns=require(d, "window_end_ns", int, where),
            patterns=tuple(patterns),
            local_rank=optional(d, "local_rank", int, where, -1),
            pid=optional(d, "pid", int, where, 0),
            coords={str(k): _coord(v, f"{where}.coords[{k!r:.40}]") for k, v in coords.items()},
            source=optional(d, "source", str, where, "online"),
            gpu=optional(d, "gpu", bool, where, False),
            iteration_ms=tuple(_finite(x, f"{where}.iteration_ms") for x in optional(d, "iteration_ms", list, where, [])),
            window_cost=window_cost_fields(optional(d, "window_cost", dict, where, {}), f"{where}.window_cost"),
            cpu_place=optional(d, "cpu_place", str, where, ""),
            **parse_groups_fields(d, where),
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


def _finite(v: Any, w: str) -> float:
    """A finite JSON number (not a string such as "nan", not a bool), or SchemaError."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SchemaError(f"{w}: not a finite number: {v!r:.40}")
    return float(v)


def groups_fields_dict(groups: Sequence[ProcessGroup], comm: Mapping[str, Sequence[str]],
                       steps_ms: Sequence[float], step_group: str,
                       step_record: StepRecord | None = None) -> dict[str, Any]:
    """The process-group fields of a PatternSet's dict or a wire worker's, only those there are
    (older readers never see them); ``parse_groups_fields`` reads them back."""
    out: dict[str, Any] = {}
    if groups:
        out["groups"] = [g.to_list() for g in groups]
    if comm:
        out["comm"] = {k: list(v) for k, v in comm.items()}
    if steps_ms:
        out["steps_ms"] = [round(float(x), 4) for x in steps_ms]
        out["step_group"] = step_group
    if step_record is not None:
        out["step_record"] = step_record.to_dict()
    return out


def parse_groups_fields(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The process-group fields (``groups``, ``comm``, ``steps_ms``, ``step_group``) of a
    PatternSet's dict or a wire worker's, checked; SchemaError names the field."""
    return {
        "groups": tuple(ProcessGroup.from_list(g, f"{where}.groups[{i}]")
                        for i, g in enumerate(optional(d, "groups", list, where, []))),
        "comm": _comm(optional(d, "comm", dict, where, {}), f"{where}.comm"),
        "steps_ms": tuple(_finite(x, f"{where}.steps_ms") for x in optional(d, "steps_ms", list, where, [])),
        "step_group": optional(d, "step_group", str, where, ""),
        "step_record": _step_record(optional(d, "step_record", dict, where, {}), f"{where}.step_record"),
    }


def _step_record(d: Mapping[str, Any], where: str) -> StepRecord | None:
    """The step record, or None when there is none or it is of a version this perftracker does not
    read (the worker's patterns still count; the replay falls back to the estimate)."""
    if not d:
        return None
    try:
        return StepRecord.from_dict(d, where)
    except RecordVersionError as exc:
        _warn_once(f"step-record-version:{d.get('v')!r:.20}", "%s; what fixing a culprit saves is estimated", exc)
        return None


def _comm(d: Mapping[str, Any], w: str) -> dict[str, tuple[str, ...]]:
    out = {}
    for k, v in d.items():
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise SchemaError(f"{w}[{k!r:.40}]: expected a list of group names")
        out[str(k)] = tuple(v)
    return out


def _coord(v: Any, w: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SchemaError(f"{w}: not an integer: {v!r:.40}")
    return v


def _pattern_from_row(row: Any, frames: list[Any], w: str) -> Pattern:
    """One row of ``PatternSet.to_dict()["patterns"]``, with every check; SchemaError names the field."""
    if not isinstance(row, list) or len(row) != 9:
        raise SchemaError(f"{w}: expected a list of 9 fields")
    key, cat, beta, mu, sigma, label, n, crit_ns, resource = row
    category = parse_category(cat, w)
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
