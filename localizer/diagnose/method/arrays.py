"""All workers' patterns of one session as arrays: the localizer's working form.

``localize()`` turns PatternSets into a ``PatternArrays``; callers that already hold arrays (the
1M-worker benchmark, a columnar store) build one directly and call ``localize_arrays``. A function
seen on some workers and not on others has the pattern (0, 0, 0) on the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from perftracker.errors import InputError
from perftracker.model import Category, PatternSet
from perftracker.model.patterns import ProcessGroup
from perftracker.model.step_record import StepRecord
from perftracker.model.window_cost import worst_of

_RANGE_TOLERANCE = 1e-6  # the model accepts values a hair outside [0, 1]; they are clipped


@dataclass(frozen=True)
class FunctionInfo:
    """The identity of one function across workers."""

    key: str
    label: str
    category: Category
    resource: str = ""


@dataclass(frozen=True, eq=False)
class GroupInstance:
    """One process group of the job as the localizer sees it: its members' worker columns, in the
    group's own order (a pipeline group's order is its stages')."""

    name: str
    desc: str
    members: np.ndarray  # (M,) int64 worker columns of the members present
    p2p: bool = False  # its members send and receive point to point (a pipeline)


@dataclass(frozen=True)
class JobGroups:
    """The job's process groups, where the workers' PatternSets name them (read from the traces)."""

    groups: tuple[GroupInstance, ...] = ()
    comm: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # function key -> group indexes
    steps: np.ndarray | None = None  # (N, K) compute ms per step, NaN where a worker has fewer steps
    step_group: np.ndarray | None = None  # (N,) index of the group that cut each worker's steps, -1: none

    @property
    def read(self) -> bool:
        return bool(self.groups)


@dataclass(frozen=True, eq=False)
class PatternArrays:
    """values[f, d, w]: dimension d (β, μ, σ) of function f on worker w (column w has rank ranks[w])."""

    job: str
    session: str
    ranks: np.ndarray  # (N,) int64, unique
    functions: tuple[FunctionInfo, ...]  # (F,)
    values: np.ndarray  # (F, 3, N) float64 in [0, 1]
    window_s: float = 0.0
    gpu: bool = False
    world_size: int = 0  # 0: unknown
    iteration_ms: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    offline: bool = False  # every worker's patterns come from a trace file (no hardware samples)
    worker_window_s: np.ndarray | None = None  # (N,) each worker's own window; None: all window_s
    stage: np.ndarray | None = None  # (N,) pipeline stage ("pp" coordinate) or -1; None: unknown
    job_groups: JobGroups = field(default_factory=JobGroups)  # process groups, when the patterns name them
    window_cost: Mapping[str, float] = field(default_factory=dict)  # the worst rank's (model.window_cost.worst_of)
    # per worker column, its step record (the replay of what fixing a culprit saves); () : none has one
    step_records: tuple[StepRecord | None, ...] = ()
    # per worker, "<host>|<cgroup>|<allowed CPUs>" (PatternSet.cpu_place with the host; "" unknown): two
    # workers with the same non-empty value share their cores (issue 31)
    cpu_places: tuple[str, ...] = ()

    @property
    def n_workers(self) -> int:
        return int(self.ranks.shape[0])


def pattern_sets_to_arrays(pattern_sets: Sequence[PatternSet]) -> PatternArrays:
    """Validate PatternSets of one session and stack them. Raises InputError on bad input."""
    sets = list(pattern_sets)
    if not sets:
        raise InputError("no pattern sets to localize (an empty set)")
    jobs = sorted({p.job for p in sets})
    if len(jobs) > 1:
        raise InputError(f"pattern sets from different jobs: {jobs[:5]}")
    sessions = sorted({p.session for p in sets})
    if len(sessions) > 1:
        raise InputError(f"pattern sets from different sessions: {sessions[:5]}")
    seen: dict[int, int] = {}
    dups = []
    for s in sets:
        if s.rank in seen:
            dups.append(s.rank)
        seen[s.rank] = 1
    if dups:
        raise InputError(f"duplicate ranks in session {sessions[0]!r}: {sorted(set(dups))[:20]}")

    index: dict[str, int] = {}
    infos: list[FunctionInfo] = []
    fcol: list[int] = []
    wcol: list[int] = []
    vcol: list[float] = []
    for w, ps in enumerate(sets):
        before = len(fcol)
        for p in ps.patterns:
            f = index.get(p.key)
            if f is None:
                f = index[p.key] = len(infos)
                infos.append(FunctionInfo(p.key, p.label or p.key.rsplit(";", 1)[-1], p.category, p.resource))
            elif infos[f].category is not p.category:
                raise InputError(f"rank {ps.rank}: function {p.key!r} has category {p.category.value!r}, "
                                 f"other ranks say {infos[f].category.value!r}")
            fcol.append(f)
            vcol += (p.beta, p.mu, p.sigma)
        if len(set(fcol[before:])) != len(fcol) - before:
            raise InputError(f"rank {ps.rank}: a function appears twice in one pattern set")
        wcol += [w] * (len(fcol) - before)
    values = np.zeros((len(infos), 3, len(sets)), dtype=np.float64)
    if fcol:
        fi = np.array(fcol, dtype=np.int64)
        wi = np.array(wcol, dtype=np.int64)
        triples = np.array(vcol, dtype=np.float64).reshape(-1, 3)
        for d in range(3):
            values[fi, d, wi] = triples[:, d]
    if np.isnan(values).any():
        f, d, w = (int(i[0]) for i in np.nonzero(np.isnan(values)))
        raise InputError(f"rank {sets[w].rank}: function {infos[f].key!r} has a NaN "
                         f"{('beta', 'mu', 'sigma')[d]}")
    _check_range(values, [s.rank for s in sets], infos)
    np.clip(values, 0.0, 1.0, out=values)
    starts = [s.window_start_ns for s in sets]
    ends = [s.window_end_ns for s in sets]
    window_s = max(0.0, (float(np.median(ends)) - float(np.median(starts))) / 1e9)
    groups = job_groups(sets)
    return PatternArrays(
        job=jobs[0], session=sessions[0], ranks=np.array([s.rank for s in sets], dtype=np.int64),
        functions=tuple(infos), values=values, window_s=window_s, gpu=any(s.gpu for s in sets),
        world_size=max(s.world_size for s in sets),
        iteration_ms={s.rank: tuple(s.iteration_ms) for s in sets if s.iteration_ms},
        offline=all(s.source != "online" for s in sets),
        worker_window_s=np.array([max(0.0, (s.window_end_ns - s.window_start_ns) / 1e9) for s in sets]),
        stage=_stages(sets, groups),
        job_groups=groups,
        window_cost=worst_of([s.window_cost for s in sets]),
        step_records=step_records(sets),
        cpu_places=cpu_places(sets),
    )


def cpu_places(sets: Sequence[object]) -> tuple[str, ...]:
    """Each worker's host and CPU place (``PatternSet.cpu_place``), "" where unknown; () when none is known."""
    places = tuple(f"{getattr(s, 'host', '')}|{p}" if (p := getattr(s, "cpu_place", "")) else "" for s in sets)
    return places if any(places) else ()


def step_records(sets: Sequence[object]) -> tuple[StepRecord | None, ...]:
    """Each worker's step record, () when none has one (an older worker's upload)."""
    records = tuple(getattr(s, "step_record", None) for s in sets)
    return records if any(r is not None for r in records) else ()


def _stages(sets: Sequence[WorkerGroups], groups: JobGroups) -> np.ndarray | None:
    """Each worker's pipeline stage from its parallel coordinates ("pp"), else its position in its
    point-to-point group (the pipeline's members in stage order); None when neither is known."""
    if any("pp" in s.coords for s in sets):
        return np.array([int(s.coords.get("pp", -1)) for s in sets], dtype=np.int64)
    pipes = [g for g in groups.groups if g.p2p and g.members.size >= 2]
    if not pipes:
        return None
    stage = np.full(len(sets), -1, dtype=np.int64)
    for g in sorted(pipes, key=lambda g: g.members.size):  # the largest pipeline group wins
        stage[g.members] = np.arange(g.members.size)
    return stage


class WorkerGroups(Protocol):
    """What the process groups are read from: a PatternSet, or a wire worker (the service's columns)."""

    @property
    def rank(self) -> int: ...
    @property
    def coords(self) -> Mapping[str, int]: ...
    @property
    def groups(self) -> tuple[ProcessGroup, ...]: ...
    @property
    def comm(self) -> Mapping[str, tuple[str, ...]]: ...
    @property
    def steps_ms(self) -> tuple[float, ...]: ...
    @property
    def step_group(self) -> str: ...


def stages(sets: Sequence[WorkerGroups], groups: JobGroups) -> np.ndarray | None:
    """Each worker's pipeline stage (``_stages``)."""
    return _stages(sets, groups)


def job_groups(sets: Sequence[WorkerGroups]) -> JobGroups:
    """The process groups the workers' PatternSets name, as worker columns; empty when none does.
    A group's members are the ranks its description lists that are present (in the group's order);
    a group named only by its users is the set of workers that name it."""
    if not any(s.groups for s in sets):
        return JobGroups()
    col = {s.rank: w for w, s in enumerate(sets)}
    index: dict[str, int] = {}
    desc: list[str] = []
    ranks: list[Sequence[int]] = []
    p2p: list[bool] = []
    users: list[list[int]] = []
    for w, s in enumerate(sets):
        for g in s.groups:
            i = index.get(g.name)
            if i is None:
                i = index[g.name] = len(desc)
                desc.append(g.desc)
                ranks.append(g.ranks)
                p2p.append(g.p2p)
                users.append([])
            p2p[i] = p2p[i] or g.p2p
            if len(g.ranks) > len(ranks[i]):
                ranks[i] = g.ranks
            users[i].append(w)
    groups = []
    for name, i in index.items():
        rs = ranks[i]
        if isinstance(rs, range) and rs.step > 0 and len(rs) > len(col):  # a large run: walk the workers
            members = [col[r] for r in sorted(col) if r in rs]
        else:
            members = [col[r] for r in rs if r in col] if rs else sorted(users[i])
        groups.append(GroupInstance(name, desc[i], np.array(members, dtype=np.int64), p2p[i]))
    comm: dict[str, set[int]] = {}
    for s in sets:
        for key, names in s.comm.items():
            comm.setdefault(key, set()).update(index[n] for n in names if n in index)
    steps = None
    step_group = None
    if any(s.steps_ms for s in sets):
        k = max(len(s.steps_ms) for s in sets)
        steps = np.full((len(sets), k), np.nan)
        step_group = np.full(len(sets), -1, dtype=np.int64)
        for w, s in enumerate(sets):
            if s.steps_ms and s.step_group in index:
                steps[w, k - len(s.steps_ms):] = s.steps_ms  # aligned on the last step
                step_group[w] = index[s.step_group]
    return JobGroups(tuple(groups), {k: tuple(sorted(v)) for k, v in comm.items()}, steps, step_group)


def _check_range(values: np.ndarray, ranks: Sequence[int] | np.ndarray, infos: Sequence[FunctionInfo]) -> None:
    bad = (values < -_RANGE_TOLERANCE) | (values > 1 + _RANGE_TOLERANCE)
    if bad.any():
        f, d, w = (int(i[0]) for i in np.nonzero(bad))
        raise InputError(f"rank {int(ranks[w])}: function {infos[f].key!r} has "
                         f"{('beta', 'mu', 'sigma')[d]} = {values[f, d, w]!r}, outside [0, 1]")


def validate_arrays(arr: PatternArrays) -> None:
    """The checks of pattern_sets_to_arrays, for arrays built directly. Raises InputError."""
    n = arr.ranks.shape[0] if arr.ranks.ndim == 1 else -1
    if n <= 0:
        raise InputError("no workers to localize (an empty set)")
    if arr.values.shape != (len(arr.functions), 3, n):
        raise InputError(f"values has shape {arr.values.shape}, expected {(len(arr.functions), 3, n)}")
    if arr.values.dtype != np.float64:
        raise InputError(f"values must be float64, got {arr.values.dtype}")
    if not bool(np.all(arr.ranks[1:] > arr.ranks[:-1])):  # already strictly increasing: no sort needed
        sorted_ranks = np.sort(arr.ranks)
        dup = sorted_ranks[1:][sorted_ranks[1:] == sorted_ranks[:-1]]
    else:
        dup = arr.ranks[:0]
    if dup.size:
        raise InputError(f"duplicate ranks in session {arr.session!r}: {np.unique(dup)[:20].tolist()}")
    keys = [f.key for f in arr.functions]
    if len(set(keys)) != len(keys):
        raise InputError("a function key appears twice")
    for f in range(len(arr.functions)):  # per function keeps temporaries small at N = 1M
        v = arr.values[f]
        low, high = float(v.min()), float(v.max())  # NaN propagates into both
        if low >= 0.0 and high <= 1.0:
            continue
        if np.isnan(v).any():
            d, w = (int(i[0]) for i in np.nonzero(np.isnan(v)))
            raise InputError(f"rank {int(arr.ranks[w])}: function {keys[f]!r} has a NaN "
                             f"{('beta', 'mu', 'sigma')[d]}")
        _check_range(arr.values[f:f + 1], arr.ranks, arr.functions[f:f + 1])
        raise InputError(f"function {keys[f]!r}: values outside [0, 1]")


def nan_row_means(a: np.ndarray) -> np.ndarray:
    """The mean of each row over its finite values; NaN for a row with none (``np.nanmean`` warns
    "Mean of empty slice" there, and a warning must not reach the user of ``perftracker analyze``)."""
    a = np.asarray(a, dtype=np.float64)
    ok = np.isfinite(a)
    n = ok.sum(axis=-1)
    total = np.where(ok, a, 0.0).sum(axis=-1)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def nan_col_medians(a: np.ndarray) -> np.ndarray:
    """The median of each column over its finite values; NaN for a column with none, without
    ``np.nanmedian``'s "All-NaN slice" warning."""
    a = np.asarray(a, dtype=np.float64)
    out = np.full(a.shape[1:], np.nan)
    ok = np.isfinite(a).any(axis=0)
    if ok.any():
        out[ok] = np.nanmedian(a[:, ok], axis=0)
    return out

