"""Assemble a ``RawWindow`` from what a window captured: Kineto rows, sampled Python executions and
GC pauses. Runs off the main thread, after the window. Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import CodeType
from typing import Any

import numpy as np

from perftracker.model.raw_window import COLUMNS, EventKind, RawWindow, WindowMeta
from perftracker.runtime import dist_record
from perftracker.runtime.comm_rows import with_recorded_groups
from perftracker.runtime.profiler import KinetoRows
from perftracker.runtime.stack_sampler import PythonExecutions, frame_name
from perftracker.runtime.throttle import NoThrottle, Throttle


class _Interner:
    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.stacks: dict[tuple[int, ...], int] = {}

    def name(self, s: str) -> int:
        return self.names.setdefault(s, len(self.names))

    def stack(self, ids: tuple[int, ...]) -> int:
        return self.stacks.setdefault(ids, len(self.stacks))


class _StackTrie:
    """Call stacks as a trie of (caller node, name id) -> node, so that a stack costs one small
    dict lookup instead of building and hashing a depth-long tuple. A node's stack is interned
    (``_Interner.stack``) the first time a row asks for its id, keeping the interning order."""

    def __init__(self, it: _Interner) -> None:
        self.it = it
        self.child: dict[tuple[int, int], int] = {}
        self.tuples: list[tuple[int, ...]] = []
        self.sids: list[int] = []

    def node(self, parent: int, name_id: int) -> int:
        key = (parent, name_id)
        n = self.child.get(key)
        if n is None:
            n = self.child[key] = len(self.tuples)
            self.tuples.append((self.tuples[parent] if parent >= 0 else ()) + (name_id,))
            self.sids.append(-1)
        return n

    def sid(self, node: int) -> int:
        s = self.sids[node]
        if s < 0:
            s = self.sids[node] = self.it.stack(self.tuples[node])
        return s


def nest_parents(
    start_ns: np.ndarray, end_ns: np.ndarray, group: np.ndarray, throttle: Throttle | None = None
) -> np.ndarray:
    """Index of the innermost enclosing row with the same group key (thread + kind family), or -1.

    In the order (group, start, longest first), a row's parent is the last earlier row of its
    group that ends after it starts (what a stack walk finds: every earlier row that ends by then
    has been popped). Found by pointer jumping: start from the previous row and follow the current
    guesses while the guess ends by the row's start; each guess stays at or above the answer, so
    it converges to it, in about as many numpy passes as the nesting is deep."""
    tick = (throttle or NoThrottle()).tick
    n = len(start_ns)
    parent = np.full(n, -1, np.int32)
    if n == 0:
        return parent
    order = np.lexsort((-end_ns, start_ns, group))
    g, s, e = group[order], start_ns[order], end_ns[order]
    cand = np.arange(-1, n - 1, dtype=np.int64)  # in sorted positions
    cand[1:][g[1:] != g[:-1]] = -1
    cand[0] = -1
    todo = np.flatnonzero(cand >= 0)
    while len(todo):
        tick(len(todo))
        c = cand[todo]
        bad = e[c] <= s[todo]
        todo = todo[bad]
        cand[todo] = cand[c[bad]]
        todo = todo[cand[todo] >= 0]
    parent[order] = np.where(cand >= 0, order[np.maximum(cand, 0)], -1)
    return parent


def _python_stack_ids(python: PythonExecutions, it: _Interner, tick: Callable[[int], None]) -> list[int]:
    """Stack id per execution; each code's name is formatted once, each stack extends its parent's."""
    code_ids: dict[CodeType, int] = {}
    trie = _StackTrie(it)
    node_of: list[int] = []
    out: list[int] = []
    parents = python.parent.tolist()
    for i, codes in enumerate(python.stack):
        p = parents[i]
        if p >= 0 and len(codes) == len(trie.tuples[node_of[p]]) + 1:
            prefix = node_of[p]
        else:  # not nested under its parent's stack (never from python_executions): walk it all
            prefix = -1
            for c in codes[:-1]:
                prefix = trie.node(prefix, _code_id(c, code_ids, it))
        node = trie.node(prefix, _code_id(codes[-1], code_ids, it))
        node_of.append(node)
        out.append(trie.sid(node))
        if i % 1024 == 1023:
            tick(1024)
    return out


def _code_id(code: CodeType, cache: dict[CodeType, int], it: _Interner) -> int:
    i = cache.get(code)
    if i is None:
        i = cache[code] = it.name(frame_name(code))
    return i


def build_raw_window(
    meta: WindowMeta,
    kineto: KinetoRows | None,
    python: PythonExecutions | None,
    gc_pauses: Sequence[tuple[int, int, int]] = (),
    throttle: Throttle | None = None,
) -> RawWindow:
    """One RawWindow, rows sorted by (start, longest first); parents re-indexed accordingly.

    Row blocks, in this order: sampled Python executions, Kineto events, GC pauses. Names are
    interned in that order too; each block is built with numpy."""
    tick = (throttle or NoThrottle()).tick
    it = _Interner()
    blocks: list[dict[str, np.ndarray]] = []
    groups: list[np.ndarray] = []  # per block: nesting group per row, -1 where the parent is set
    n_rows = 0

    def block(kind: Any, name_id: Any, tid: Any, device: Any, start: Any, end: Any, stack_id: Any,
              parent: Any, group: Any) -> None:
        nonlocal n_rows
        cols = {"kind": kind, "name_id": name_id, "tid": tid, "device": device, "start_ns": start,
                "end_ns": end, "stack_id": stack_id, "parent": parent}
        m = len(start)
        blocks.append({k: np.broadcast_to(np.asarray(v, COLUMNS[k]), (m,)) for k, v in cols.items()})
        groups.append(np.broadcast_to(np.asarray(group, np.int64), (m,)))
        n_rows += m

    if python is not None and len(python.start_ns):
        base = n_rows
        sids = np.array(_python_stack_ids(python, it, tick), np.int64)
        stacks = list(it.stacks)  # id -> tuple (dicts keep insertion order)
        last_name = np.array([stacks[i][-1] for i in sids.tolist()], np.int64)
        p = python.parent.astype(np.int64)
        block(EventKind.PYTHON, last_name, meta.training_tid, -1, python.start_ns, python.end_ns, sids,
              np.where(p >= 0, base + p, -1), -1)

    if kineto is not None and len(kineto):
        base = n_rows
        m = len(kineto)
        local = np.asarray(kineto.name_idx, np.int64)
        used, first = np.unique(local, return_index=True)
        to_global = np.zeros(len(kineto.name_table), np.int64)
        for j in np.argsort(first, kind="stable").tolist():  # interned in order of first use
            to_global[used[j]] = it.name(kineto.name_table[used[j]])
        name_id = to_global[local]
        tick(m)
        kind = np.asarray(kineto.kind, np.int64)
        is_py = kind == int(EventKind.PYTHON)
        # nesting families: CPU ops and annotations nest together per (thread, device); others by kind
        fam = np.where((kind == int(EventKind.CPU_OP)) | (kind == int(EventKind.ANNOTATION)), 0, kind + 1)
        key = np.stack([np.asarray(kineto.tid, np.int64), np.asarray(kineto.device, np.int64), fam], axis=1)
        _, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
        rank = np.empty(len(first), np.int64)  # families numbered by first appearance
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        group = np.where(is_py, -1, rank[inv.reshape(-1)])
        parent = np.full(m, -1, np.int64)
        stack_id = np.full(m, -1, np.int64)
        if is_py.any():  # tracer mode: parents from Kineto python ids, stacks from the parent chain
            _tracer_parents_and_stacks(kineto, name_id, base, parent, stack_id, it)
        block(kind, name_id, kineto.tid, kineto.device, kineto.start_ns, kineto.end_ns, stack_id, parent, group)

    lo, hi = meta.window_start_ns, meta.window_end_ns  # a pause across an edge counts inside the window only
    gc_rows = [(max(s, lo), min(e, hi)) for s, e, _gen in gc_pauses if not (e < lo or s > hi)]
    if gc_rows:
        gc_id = it.name("Python GC")
        arr = np.array(gc_rows, np.int64).reshape(-1, 2)
        block(EventKind.GC, gc_id, meta.training_tid, -1, arr[:, 0], arr[:, 1], -1, -1, -1)

    if blocks:
        cols = {k: np.concatenate([b[k] for b in blocks]).astype(COLUMNS[k]) for k in COLUMNS}
        groups_all = np.concatenate(groups)
    else:
        cols = {k: np.zeros(0, COLUMNS[k]) for k in COLUMNS}
        groups_all = np.zeros(0, np.int64)
    nested = groups_all >= 0
    if nested.any():
        idx = np.nonzero(nested)[0]
        sub = nest_parents(cols["start_ns"][idx], cols["end_ns"][idx], groups_all[idx], throttle)
        cols["parent"][idx] = np.where(sub >= 0, idx[np.maximum(sub, 0)], -1).astype(np.int32)
    order = np.lexsort((-cols["end_ns"], cols["start_ns"]))
    new_index = np.empty(len(order), np.int64)
    new_index[order] = np.arange(len(order))
    cols = {k: v[order] for k, v in cols.items()}
    p = cols["parent"]
    cols["parent"] = np.where(p >= 0, new_index[np.maximum(p, 0)], -1).astype(np.int32)
    raw = RawWindow(meta=meta, columns=cols, names=tuple(it.names), stacks=tuple(it.stacks))
    recorded = dist_record.recorded(meta.session)  # the job's process groups, each collective's group
    return with_recorded_groups(raw, *recorded) if recorded is not None else raw


def _tracer_parents_and_stacks(kineto: KinetoRows, name_id: np.ndarray, base: int, parent: np.ndarray,
                               stack_id: np.ndarray, it: _Interner) -> None:
    """Tracer-mode Python rows: parent = the row of the Kineto python parent id; the stack is the
    chain of parent names (outermost first)."""
    py_id = np.asarray(kineto.python_id, np.int64).tolist()
    py_parent = np.asarray(kineto.python_parent_id, np.int64).tolist()
    rows = np.flatnonzero(np.asarray(kineto.kind, np.int64) == int(EventKind.PYTHON)).tolist()
    row_of = {py_id[j]: j for j in rows if py_id[j] >= 0}
    local_parent = {j: row_of.get(py_parent[j], -1) for j in rows}
    for j, pj in local_parent.items():
        parent[j] = base + pj if pj >= 0 else -1
    trie = _StackTrie(it)
    node_of: dict[int, int] = {}
    names = name_id.tolist()
    for row in row_of.values():
        chain: list[int] = []
        r = row
        while r >= 0 and r not in node_of and len(chain) <= len(rows):  # (a parent-id cycle ends here)
            chain.append(r)
            r = local_parent.get(r, -1)
        node = node_of.get(r, -1) if r >= 0 else -1
        for rr in reversed(chain):
            node = node_of[rr] = trie.node(node, names[rr])
        stack_id[row] = trie.sid(node_of[row])
