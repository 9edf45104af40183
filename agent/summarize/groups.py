"""A worker's process groups and per-step compute, for the PatternSet (issue 28). Pure numpy.

- ``groups``: the process groups the worker belongs to (``WindowMeta.process_groups`` and the
  groups its communication events name), each marked ``p2p`` when the worker sent or received
  point-to-point in it (a ``Src Rank``/``Dst Rank``, or a send/recv collective).
- ``comm``: per collective function key, the groups its events ran in.
- ``steps_ms``: the worker's compute time per step, a handful of numbers that let the localizer
  see who arrives last at each step's synchronization, not only on average over the window. Steps
  are cut by the iteration marks (``ProfilerStep#N``) when the window holds at least
  ``MIN_STEPS`` of them, else by the instances of one collective of the worker's largest
  non-p2p group: the (group, collective) that occurs least often, at least ``MIN_STEPS`` + 1
  times (a data-parallel all-reduce, reduce-scatter or all-gather runs once per step). Compute is
  the union of the compute frames' intervals between consecutive boundaries. At most
  ``MAX_STEPS`` (the last ones) are kept.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from perftracker.model import ProcessGroup
from perftracker.model.raw_window import COLUMNS, RawWindow, WindowMeta

MIN_STEPS = 3
MAX_STEPS = 64
_P2P = ("send", "recv", "sendrecv", "isend", "irecv")


def group_label(meta: WindowMeta, group: str) -> str:
    """What a group is for, the same on every worker: its description (``DATA_PARALLEL_GROUP``),
    else "group of N" (its size), else its name."""
    for name, desc, ranks in meta.process_groups:
        if name == group:
            if desc and desc.lower() not in ("undefined", "unknown", "none"):
                return desc
            return f"group of {len(ranks)}" if ranks else f"group {group}"
    return f"group {group}"


def shared_names(meta: WindowMeta) -> dict[tuple[str, int], str]:
    """(event name, start ns) -> a name of its own, for the communication events whose name runs in
    more than one group on this worker (the same all-reduce kernel in the data-parallel and the
    tensor- or embedding-parallel group): "<name> [<group label>]". Judged as one function they
    would be one β, the sum of two groups' waits."""
    labels: dict[str, set[str]] = {}
    for c in meta.comm:
        labels.setdefault(c[0], set()).add(group_label(meta, c[3]))
    return {(c[0], c[1]): f"{c[0]} [{group_label(meta, c[3])}]" for c in meta.comm if len(labels[c[0]]) > 1}


def split_shared(raw: RawWindow) -> RawWindow:
    """``raw`` with each communication event whose name runs in several groups renamed by its group
    (``shared_names``); ``raw`` itself when there is none."""
    renames = shared_names(raw.meta)
    if not renames:
        return raw
    names = list(raw.names)
    index = {n: i for i, n in enumerate(names)}
    name_id = raw.col("name_id").copy()
    start = raw.col("start_ns")
    shared = [index[n] for n in {n for n, _ in renames} if n in index]
    for row in np.flatnonzero(np.isin(name_id, shared)).tolist():  # only the rows of shared names
        new = renames.get((names[int(name_id[row])], int(start[row])))
        if new is not None:
            if new not in index:
                index[new] = len(names)
                names.append(new)
            name_id[row] = index[new]
    cols = dict(raw.columns)
    cols["name_id"] = name_id.astype(COLUMNS["name_id"])
    return RawWindow(meta=raw.meta, columns=cols, names=tuple(names), stacks=raw.stacks)


def worker_groups(meta: WindowMeta, normalize: dict[str, str]) -> tuple[tuple[ProcessGroup, ...],
                                                                        dict[str, tuple[str, ...]]]:
    """(the worker's groups, collective function key -> group names). ``normalize`` maps an event
    name to its function key (names shared by several groups carry their group: ``split_shared``)."""
    p2p = {c[3] for c in meta.comm if c[6] >= 0 or c[7] >= 0 or c[4].lower() in _P2P}
    renames = shared_names(meta)
    used: dict[str, set[str]] = {}
    for c in meta.comm:
        name = renames.get((c[0], c[1]), c[0])
        used.setdefault(normalize.get(name, name), set()).add(c[3])
    groups = []
    for name, desc, ranks in meta.process_groups:
        if ranks and meta.rank not in ranks:
            continue
        groups.append(ProcessGroup(name, desc, ranks if isinstance(ranks, range) else tuple(ranks), name in p2p))
    return tuple(groups), {k: tuple(sorted(v)) for k, v in sorted(used.items())}


def step_bounds(meta: WindowMeta, groups: tuple[ProcessGroup, ...], step_marks: np.ndarray
                ) -> tuple[np.ndarray, str]:
    """(boundaries in ns, increasing; the group that cut them, "" for iteration marks).
    ``step_marks``: (k, 2) start and end of the window's iteration marks."""
    if len(step_marks) >= MIN_STEPS:
        order = np.argsort(step_marks[:, 0], kind="stable")
        marks = step_marks[order]
        return np.r_[marks[:, 0], marks[-1, 1]].astype(np.int64), ""
    size = {g.name: len(g.ranks) for g in groups if not g.p2p}
    instances = _instances(meta, set(size))
    count = Counter((g, coll) for g, coll, _ in instances)
    best = sorted((n, -size[g], g, coll) for (g, coll), n in count.items() if n > MIN_STEPS)
    if not best:
        return np.zeros(0, dtype=np.int64), ""
    _, _, group, coll = best[0]
    ends = np.sort(np.array([e for (g, c, _), e in instances.items() if g == group and c == coll], dtype=np.int64))
    return ends, group


def _instances(meta: WindowMeta, groups: set[str]) -> dict[tuple[str, str, int], int]:
    """(group, collective, instance) -> its end (ns), for the comm rows in ``groups``: rows that share
    a sequence number (>= 0) are one instance (a live window's c10d op, gloo event and the Python
    frames of one call), the latest end; a row without one is an instance of its own."""
    out: dict[tuple[str, str, int], int] = {}
    for i, c in enumerate(meta.comm):
        if c[3] in groups:
            key = (c[3], c[4], c[5] if c[5] >= 0 else -1 - i)
            out[key] = max(out.get(key, c[2]), c[2])
    return out


def busy_between(start_ns: np.ndarray, end_ns: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """The union of the intervals [start, end) inside each [bounds[i], bounds[i+1]), in ns."""
    if len(bounds) < 2:
        return np.zeros(0)
    if len(start_ns) == 0:
        return np.zeros(len(bounds) - 1)
    order = np.argsort(start_ns, kind="stable")
    s, e = start_ns[order].astype(np.int64), end_ns[order].astype(np.int64)
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]  # a new disjoint run starts where no earlier interval reaches
    run = np.cumsum(new) - 1
    us = s[new]
    ue = np.zeros(int(run[-1]) + 1, dtype=np.int64)
    np.maximum.at(ue, run, e)
    done = np.r_[0, np.cumsum(ue - us)]

    def busy_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(us, t, side="right")  # runs that start at or before t
        partial = np.where(k > 0, np.clip(t - us[np.maximum(k - 1, 0)], 0, None), 0)
        full = done[np.maximum(k - 1, 0)]
        inside = np.minimum(partial, (ue - us)[np.maximum(k - 1, 0)])
        return np.where(k > 0, full + inside, 0).astype(np.float64)

    b = busy_until(bounds.astype(np.int64))
    return np.diff(b)


def steps_ms(bounds: np.ndarray, group: str, compute_start: np.ndarray, compute_end: np.ndarray
             ) -> tuple[tuple[float, ...], str]:
    """(compute per step in ms, the group that cut the steps) between ``step_bounds``' boundaries;
    () when the window shows too few."""
    if len(bounds) < MIN_STEPS + 1:
        return (), ""
    busy = busy_between(compute_start, compute_end, bounds)[-MAX_STEPS:]
    return tuple(round(float(x) / 1e6, 4) for x in busy), group
