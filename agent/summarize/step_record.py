"""A worker's collective instances over the last steps of its window, for the localizer's replay of
what fixing a culprit would save (issue 28; the record: ``perftracker.model.step_record``). Pure numpy.

The instances are the communication events that name their group (``WindowMeta.comm``: a real NCCL
trace's kernels, a live window's c10d calls), rows of one instance merged by their sequence number;
where no event names a group (dlrm, older PyTorch), the NCCL kernels, else the ``gloo:`` ops, each
numbered by its occurrence of the same name. The steps are those of ``groups.step_bounds`` (the
iteration marks, else one collective of the largest group): the last ``MAX_STEPS``, fewer when the
rows would pass ``MAX_ROWS`` (a few KB on the wire).
"""

from __future__ import annotations

import numpy as np
from perftracker.agent.summarize.groups import _P2P, busy_between, group_label

from perftracker.model.raw_window import EventKind, RawWindow
from perftracker.model.step_record import StepRecord

MAX_STEPS = 8
MAX_ROWS = 256
MIN_STEPS = 2

# (group, kind, seq, src, dst, start_ns, end_ns)
_Event = tuple[str, str, int, int, int, int, int]


def instance_events(raw: RawWindow) -> list[_Event]:
    """The worker's collective instances in start order (see the module doc)."""
    meta = raw.meta
    if meta.comm:
        merged: dict[tuple[str, int, int, int] | tuple[str, str, int], list[int | str]] = {}
        seen: dict[tuple[str, str], int] = {}
        for c in sorted(meta.comm, key=lambda c: c[1]):
            name, start, end, group, coll, seq, src, dst = c
            p2p = src >= 0 or dst >= 0 or coll.lower() in _P2P
            kind = f"{group_label(meta, group)}:{coll or name}"
            if seq < 0:
                seq = seen.get((group, kind), 0)
                seen[(group, kind)] = seq + 1
                key: tuple[str, int, int, int] | tuple[str, str, int] = (group, kind, seq)
            else:
                key = (group, seq, src if p2p else -1, dst if p2p else -1)
            row = merged.get(key)
            if row is None:
                merged[key] = [group, kind, seq, src if p2p else -1, dst if p2p else -1, start, end]
            else:
                row[5], row[6] = min(int(row[5]), start), max(int(row[6]), end)
        out = [(str(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6])) for r in merged.values()]
        return sorted(out, key=lambda r: (r[5], r[6]))
    kind_col, name_id = raw.col("kind"), raw.col("name_id")
    low = [n.lower() for n in raw.names]
    nccl = [i for i, n in enumerate(low) if "nccl" in n]
    sel = np.flatnonzero((kind_col == EventKind.KERNEL) & np.isin(name_id, nccl))
    if not len(sel):
        gloo = [i for i, n in enumerate(low) if n.startswith("gloo:")]
        sel = np.flatnonzero((kind_col == EventKind.CPU_OP) & np.isin(name_id, gloo))
    starts, ends = raw.col("start_ns")[sel], raw.col("end_ns")[sel]
    order = np.argsort(starts, kind="stable")
    count: dict[str, int] = {}
    events: list[_Event] = []
    for i in order.tolist():
        name = raw.names[int(name_id[sel[i]])][:120]
        k = count.get(name, 0)
        count[name] = k + 1
        events.append(("", name, k, -1, -1, int(starts[i]), int(ends[i])))
    return events


def step_record(raw: RawWindow, bounds: np.ndarray, compute_start: np.ndarray,
                compute_end: np.ndarray) -> StepRecord | None:
    """The record of the last steps between ``bounds`` (ns, increasing), or None when the window
    shows fewer than ``MIN_STEPS`` steps with instances in them."""
    if len(bounds) < MIN_STEPS + 1:
        return None
    events = instance_events(raw)
    if not events:
        return None
    starts = np.array([e[5] for e in events], dtype=np.int64)
    k = min(MAX_STEPS, len(bounds) - 1)
    while k >= MIN_STEPS:
        lo, hi = int(bounds[-k - 1]), int(bounds[-1])
        inside = (starts >= lo) & (starts < hi)
        if int(inside.sum()) <= MAX_ROWS:
            break
        k -= 1
    if k < MIN_STEPS or not inside.any():
        return None
    kept = [e for e, ok in zip(events, inside.tolist(), strict=True) if ok]
    origin = int(bounds[-k - 1])
    ends = np.array([e[6] for e in kept], dtype=np.int64)
    arrivals = np.array([e[5] for e in kept], dtype=np.int64)
    prev = previous_ends(arrivals, ends, origin)
    points = np.unique(np.r_[prev, arrivals])
    cum = np.r_[0.0, np.cumsum(busy_between(compute_start, compute_end, points))]
    busy = cum[np.searchsorted(points, arrivals)] - cum[np.searchsorted(points, prev)]
    groups: dict[str, int] = {}
    kinds: dict[str, int] = {}
    rows = []
    for e, b in zip(kept, busy.tolist(), strict=True):
        g = groups.setdefault(e[0], len(groups))
        kd = kinds.setdefault(e[1], len(kinds))
        rows.append((g, kd, e[2], e[3], e[4], _us(e[5] - origin), _us(e[6] - e[5]), _us(max(b, 0.0))))
    steps = tuple(_us(x) for x in np.diff(bounds[-k - 1:]))
    return StepRecord(steps, tuple(groups), tuple(kinds), tuple(rows), host_own(raw, bounds[-k - 1:]))


# runtime calls that may wait for the device: cudaStreamSynchronize, cudaEventSynchronize,
# cudaDeviceSynchronize, and every copy (an "Async" copy to or from pageable memory waits too; the
# call itself takes a few µs when it does not)
_BLOCKING = ("synchronize", "memcpy")


def host_own(raw: RawWindow, bounds: np.ndarray) -> tuple[int, ...]:
    """Per step between ``bounds``: the time the host was not blocked in a call that may wait for
    the GPU (``_BLOCKING``), µs; () on a window without GPU kernels
    or without the host's runtime calls (a trace of GPU work alone)."""
    kind = raw.col("kind")
    if not (kind == EventKind.KERNEL).any():
        return ()
    runtime = np.flatnonzero((kind == EventKind.RUNTIME) & (raw.col("device") < 0))
    if not len(runtime):
        return ()
    low = [n.lower() for n in raw.names]
    blocking = [i for i, n in enumerate(low) if any(b in n for b in _BLOCKING)]
    rows = runtime[np.isin(raw.col("name_id")[runtime], blocking)]
    blocked = busy_between(raw.col("start_ns")[rows], raw.col("end_ns")[rows], bounds)
    return tuple(_us(max(0.0, float(x))) for x in np.diff(bounds) - blocked)


def previous_ends(arrivals: np.ndarray, ends: np.ndarray, origin: int) -> np.ndarray:
    """Per instance (in arrival order): the latest end of an earlier instance that had ended by its
    arrival (the work it follows), else ``origin``. Instances still running at an arrival (a send
    and a recv launched together) are concurrent, not predecessors."""
    out = np.full(len(arrivals), origin, dtype=np.int64)
    best = origin
    pending: list[int] = []
    for j in range(len(arrivals)):
        keep = []
        for i in pending:
            if ends[i] <= arrivals[j] + 2000:  # within 2 µs (the record rounds to 1 µs)
                best = max(best, int(ends[i]))
            else:
                keep.append(i)
        pending = keep
        out[j] = best
        pending.append(j)
    return out


def _us(ns: float) -> int:
    return int(round(float(ns) / 1000.0))

