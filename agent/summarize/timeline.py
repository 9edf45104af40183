"""Thread timelines in numpy: nesting, self-time segments, Python call-stack identities, CPU waits.

Every function here works on whole columns at once. The only Python-level loops run over nesting
depth levels (tens), never over events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perftracker.model.raw_window import UtilSeries


@dataclass(frozen=True)
class Nesting:
    parent: np.ndarray  # int64 index of the enclosing event in the same group, -1 at the root
    depth: np.ndarray  # int64 number of enclosing events


TIE_NS = 2  # ends this close are one end when starts tie (a float's reading of a decimal µs)


def nest(group: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray) -> Nesting:
    """Parent and depth of each interval among the intervals of its group (thread or stream).

    An event's parent is the latest-starting event of its group still open when it starts. Events
    that start together nest longest-outermost; ends within ``TIE_NS`` of each other are one end,
    and keep the input order, which for a trace is its writing order, parent first. A trace's times
    are decimal µs read as floats (about 1 ns apart at today's epoch), so two frames that end
    together can read 1 ns apart, a child's after its parent's; where a step cut then clips both to
    the same start, the child would otherwise nest outside its parent. Partly overlapping events (clock jitter) nest
    too; ``self_segments`` clips them.
    """
    n = len(start_ns)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return Nesting(z, z)
    order = np.lexsort((-end_ns, start_ns, group))
    # runs of the same start whose ends lie within TIE_NS of the previous one keep the input order
    g0, s0, e0 = group[order], start_ns[order], end_ns[order]
    same_start = np.r_[False, (g0[1:] == g0[:-1]) & (s0[1:] == s0[:-1])]
    tied = same_start & np.r_[False, (e0[:-1] - e0[1:]) <= TIE_NS]
    if tied.any():
        order = order[np.lexsort((order, np.cumsum(~tied)))]
    g = group[order]
    grank = np.cumsum(np.r_[False, g[1:] != g[:-1]]).astype(np.int64)  # group rank (g is sorted)
    t0 = int(start_ns.min())
    span = int(max(end_ns.max(), start_ns.max())) - t0 + 2
    s = start_ns[order] - t0
    e = end_ns[order] - t0
    key_s = grank * span + s
    key_e = np.sort(grank * span + e)
    ended = np.searchsorted(key_e, key_s, side="right") - np.searchsorted(key_e, grank * span, side="left")
    first = np.r_[0, np.flatnonzero(np.diff(grank)) + 1]
    counts = np.diff(np.r_[first, n])
    pos = np.arange(n, dtype=np.int64) - np.repeat(first, counts)
    depth = np.maximum(pos - ended, 0)
    # parent: the last earlier event of the group at depth - 1
    dmax = int(depth.max()) + 2
    idx = np.arange(n, dtype=np.int64)
    key = (grank * dmax + depth) * n + idx
    korder = np.argsort(key, kind="stable")
    ksorted = key[korder]
    want = (grank * dmax + depth - 1) * n + idx
    j = np.searchsorted(ksorted, want, side="left") - 1
    ok = (depth > 0) & (j >= 0)
    jj = np.where(ok, j, 0)
    cand = korder[jj]
    ok &= (grank[cand] == grank) & (depth[cand] == depth - 1) & (e[cand] > s)
    parent_sorted = np.where(ok, cand, -1)
    parent = np.full(n, -1, dtype=np.int64)
    parent[order] = np.where(parent_sorted >= 0, order[np.maximum(parent_sorted, 0)], -1)
    out_depth = np.empty(n, dtype=np.int64)
    out_depth[order] = np.where(ok | (depth == 0), depth, 0)
    return Nesting(parent, out_depth)


@dataclass(frozen=True)
class Segments:
    owner: np.ndarray  # int64 event index owning the segment
    start_ns: np.ndarray
    end_ns: np.ndarray


def self_segments(start_ns: np.ndarray, end_ns: np.ndarray, parent: np.ndarray) -> Segments:
    """Each event's self time as disjoint segments: its interval minus its children's."""
    n = len(start_ns)
    children = np.flatnonzero(parent >= 0)
    has_child = np.zeros(n, dtype=bool)
    has_child[parent[children]] = True
    leaves = np.flatnonzero(~has_child)
    owners = [leaves]
    starts = [start_ns[leaves]]
    ends = [end_ns[leaves]]
    if len(children):
        c = children[np.lexsort((start_ns[children], parent[children]))]
        p = parent[c]
        cs = np.clip(start_ns[c], start_ns[p], end_ns[p])
        ce = np.clip(end_ns[c], start_ns[p], end_ns[p])
        first = np.r_[True, p[1:] != p[:-1]]
        last = np.r_[p[1:] != p[:-1], True]
        prev_end = np.where(first, start_ns[p], np.r_[0, ce[:-1]])
        owners += [p, p[last]]
        starts += [prev_end, ce[last]]
        ends += [cs, end_ns[p[last]]]
    owner = np.concatenate(owners)
    s = np.concatenate(starts)
    e = np.concatenate(ends)
    keep = e > s
    return Segments(owner[keep], s[keep], e[keep])


def stack_ids(parent: np.ndarray, depth: np.ndarray, name_id: np.ndarray, member: np.ndarray
              ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Intern each member event's call stack (member ancestors' names, outermost first).

    Returns (stack id per event, -1 for non-members) and the table of (parent stack id, name id)
    per stack id, from which ``stack_names`` rebuilds the frames.
    """
    n = len(parent)
    sid = np.full(n, -1, dtype=np.int64)
    # nearest member ancestor, resolved level by level
    anc = np.full(n, -1, dtype=np.int64)
    table: list[tuple[int, int]] = []
    known: dict[int, int] = {}
    if n == 0:
        return sid, table
    m_names = int(name_id.max()) + 2 if n else 1
    order = np.argsort(depth, kind="stable")
    d_sorted = depth[order]
    bounds = np.r_[0, np.flatnonzero(np.diff(d_sorted)) + 1, n]
    for b0, b1 in zip(bounds[:-1], bounds[1:], strict=False):
        lvl = order[b0:b1]
        par = parent[lvl]
        has_par = par >= 0
        pp = np.maximum(par, 0)
        anc_lvl = np.where(has_par, np.where(member[pp], pp, anc[pp]), -1)
        anc[lvl] = anc_lvl
        mem = lvl[member[lvl]]
        if len(mem) == 0:
            continue
        a = anc[mem]
        psid = np.where(a >= 0, sid[np.maximum(a, 0)], -1)
        key = (psid + 1) * m_names + name_id[mem].astype(np.int64)
        uniq, inv = np.unique(key, return_inverse=True)
        ids = np.empty(len(uniq), dtype=np.int64)
        for i, k in enumerate(uniq.tolist()):  # one pass per distinct stack, not per event
            got = known.get(k)
            if got is None:
                got = known[k] = len(table)
                table.append((int(k // m_names) - 1, int(k % m_names)))
            ids[i] = got
        sid[mem] = ids[inv.reshape(-1)]
    return sid, table


def stack_names(sid: int, table: list[tuple[int, int]], names: tuple[str, ...] | list[str]) -> list[str]:
    frames: list[str] = []
    while sid >= 0:
        psid, nid = table[sid]
        frames.append(names[nid])
        sid = psid
    frames.reverse()
    return frames


def wait_intervals(series: UtilSeries) -> tuple[np.ndarray, np.ndarray]:
    """(start_ns, end_ns) of the waits a ``cpu_wait`` series holds, adjacent ones merged
    (the series: ``perftracker.agent.samplers.cpuwait``).

    Within its sample interval a wait sits at the end when the next interval also waits (it goes
    on), at the start when only the previous one does (it ends here), else at the end. The total
    is the series' own: Σ value[i]·(t[i] − t[i-1]).
    """
    t = np.asarray(series.t_ns, dtype=np.int64)
    v = np.clip(np.asarray(series.value, dtype=np.float64), 0.0, 1.0)
    z = np.zeros(0, dtype=np.int64)
    if len(t) == 0:
        return z, z
    t_prev = np.r_[t[0] - max(int(series.period_ns), 1), t[:-1]]
    pos = v > 0
    next_pos = np.r_[pos[1:], False]
    prev_pos = np.r_[False, pos[:-1]]
    length = np.round(v * (t - t_prev)).astype(np.int64)
    at_start = pos & prev_pos & ~next_pos
    start = np.where(at_start, t_prev, t - length)
    end = np.where(at_start, t_prev + length, t)
    keep = pos & (length > 0)
    start, end = start[keep], end[keep]
    if len(start) == 0:
        return z, z
    new = np.r_[True, start[1:] > end[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(start) - 1]
    return start[first], end[last]
