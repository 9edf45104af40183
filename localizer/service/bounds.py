"""Bounds on every integer a tenant sends (issue 33, item 1).

An upload, a registration and a hang snapshot carry ranks, world sizes, times and counts that the
localizer sizes things by, stores as int64 and compares. Each is checked here before anything is
built from it, and an upload is checked against the session's job (``check_world``): its
``world_size`` must equal the job's registered world and its ranks lie below it (a hang snapshot's
world size may be smaller: it only says whether the rank has peers). A failed check is a
RequestError (422) naming the field; nothing here allocates by a claimed size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from perftracker.localizer.service.validate import RequestError

from perftracker.model import HangSnapshot, PatternSet
from perftracker.wire.patterns import PatternBatch

MAX_WORLD = 10_000_000  # ranks of one job (a registration's cap too)
MAX_TIME_NS = 2**62  # wall-clock ns: year 2116; every time stays far inside int64
MAX_COUNT = 2**53  # executions, iterations, critical ns: exact in a float64, fits int64
MAX_WINDOW_NS = 86_400 * 10**9  # one profile window lasts at most a day
MAX_PID = 2**31 - 1
MAX_SNAPSHOT_GROUPS = 256  # process groups one rank of a hang snapshot may list (its own groups)


def _check(value: object, lo: int, hi: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise RequestError(f"{where}: expected an integer, got {value!r:.40}", status=422)
    v = int(value)
    if not lo <= v <= hi:
        raise RequestError(f"{where}: {v} outside [{lo}, {hi}]", status=422)
    return v


def _check_worker(where: str, rank: int, world_size: int, start_ns: int, end_ns: int, local_rank: int, pid: int,
                  coords: Iterable[tuple[str, int]]) -> None:
    world = _check(world_size, 1, MAX_WORLD, f"{where}.world_size")
    _check(rank, 0, world - 1, f"{where}.rank")
    start = _check(start_ns, 0, MAX_TIME_NS, f"{where}.window_start_ns")
    _check(end_ns, start, min(MAX_TIME_NS, start + MAX_WINDOW_NS), f"{where}.window_end_ns")
    _check(local_rank, -1, MAX_WORLD, f"{where}.local_rank")
    _check(pid, 0, MAX_PID, f"{where}.pid")
    for k, v in coords:
        _check(v, -1, MAX_WORLD, f"{where}.coords[{k[:40]!r}]")


def check_pattern_set(ps: PatternSet) -> None:
    """A JSON upload's integers, before they become int64 arrays (422 when one is out of range)."""
    where = f"PatternSet(rank {ps.rank!r:.24})"
    _check_worker(where, ps.rank, ps.world_size, ps.window_start_ns, ps.window_end_ns, ps.local_rank, ps.pid,
                  ps.coords.items())
    for p in ps.patterns:
        _check(p.executions, 0, MAX_COUNT, f"{where}: {p.key[:80]!r}.executions")
        _check(p.critical_ns, 0, MAX_COUNT, f"{where}: {p.key[:80]!r}.critical_ns")


def check_batch(batch: PatternBatch) -> None:
    """A node's upload: each worker's integers, and the counts' columns (int64 already)."""
    for w in batch.workers:
        _check_worker(f"worker (rank {w.rank!r:.24})", w.rank, w.world_size, w.window_start_ns, w.window_end_ns,
                      w.local_rank, w.pid, w.coords.items())
    for name, col in (("executions", batch.executions), ("critical_ns", batch.critical_ns)):
        if col.size and (int(col.min()) < 0 or int(col.max()) > MAX_COUNT):
            bad = int(col.min()) if int(col.min()) < 0 else int(col.max())
            raise RequestError(f"patterns.{name}: {bad} outside [0, {MAX_COUNT}]", status=422)


def check_world(batch: PatternBatch, registered: Mapping[int, int], world: int, job: str) -> None:
    """Each upload's world size against what was registered: the world size its rank registered
    with (``registered``) or its session's world (``PatternUploads.session_world``: the job's largest
    registered world, or the session's expected ranks when they reach further, e.g. a Kubernetes
    job's pods; 0: unknown). Anything else is a 422, so nothing is ever sized by a claimed world."""
    for w in batch.workers:
        allowed = {v for v in (registered.get(w.rank, 0), world) if v}
        if allowed and w.world_size not in allowed:
            raise RequestError(f"rank {w.rank}: world_size {w.world_size} is not the world of job {job!r} "
                               f"({' or '.join(map(str, sorted(allowed)))}, as registered and expected)", status=422)


def check_hang_snapshot(snap: HangSnapshot, world: int = 0) -> None:
    """A hang snapshot's integers, and its world size (at most the job's registered world)."""
    where = "HangSnapshot"
    size = _check(snap.world_size, 1, MAX_WORLD, f"{where}.world_size")
    _check(snap.rank, 0, size - 1, f"{where}.rank")
    if world and size > world:  # (a snapshot's world size only says whether peers exist: at most the job's)
        raise RequestError(f"{where}.world_size: {size} is larger than the world of job {snap.job!r} ({world}, "
                           "as its agents registered)", status=422)
    _check(snap.pid, 0, MAX_PID, f"{where}.pid")
    _check(snap.taken_ns, 0, MAX_TIME_NS, f"{where}.taken_ns")
    _check(snap.failed_ns, 0, MAX_TIME_NS, f"{where}.failed_ns")
    _check(snap.last_iteration, -1, MAX_COUNT, f"{where}.last_iteration")
    _check(snap.exit_code, -MAX_PID, MAX_PID, f"{where}.exit_code")
    for i, f in enumerate(snap.stack):
        _check(f.line, -1, MAX_PID, f"{where}.stack[{i}].line")
    if len(snap.groups) > MAX_SNAPSHOT_GROUPS:
        raise RequestError(f"{where}.groups: {len(snap.groups)} groups, at most {MAX_SNAPSHOT_GROUPS}", status=422)
    for i, (_name, _desc, ranks) in enumerate(snap.groups):
        if len(ranks) > size:
            raise RequestError(f"{where}.groups[{i}]: {len(ranks)} ranks in a world of {size}", status=422)
        for r in ranks:
            _check(r, 0, size - 1, f"{where}.groups[{i}] rank")
