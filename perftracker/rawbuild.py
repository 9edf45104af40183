"""Assemble a ``RawWindow`` from what a window captured: Kineto rows, sampled Python executions and
GC pauses. Runs off the main thread, after the window. Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from perftracker.profiler import KinetoRows
from perftracker.rawdata import COLUMNS, EventKind, RawWindow, WindowMeta
from perftracker.stacks import PythonExecutions, frame_name
from perftracker.throttle import NoThrottle, Throttle


class _Interner:
    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.stacks: dict[tuple[int, ...], int] = {}

    def name(self, s: str) -> int:
        i = self.names.get(s)
        if i is None:
            i = self.names[s] = len(self.names)
        return i

    def stack(self, ids: tuple[int, ...]) -> int:
        i = self.stacks.get(ids)
        if i is None:
            i = self.stacks[ids] = len(self.stacks)
        return i


def nest_parents(
    start_ns: np.ndarray, end_ns: np.ndarray, group: np.ndarray, throttle: Throttle | None = None
) -> np.ndarray:
    """Index of the innermost enclosing row with the same group key (thread + kind family), or -1."""
    tick = (throttle or NoThrottle()).tick
    n = len(start_ns)
    parent = np.full(n, -1, np.int32)
    order = np.lexsort((-end_ns, start_ns, group))
    stack: list[int] = []
    cur_group = None
    group_l, start_l, end_l = group.tolist(), start_ns.tolist(), end_ns.tolist()
    for i in order.tolist():
        tick()
        g = group_l[i]
        if g != cur_group:
            stack = []
            cur_group = g
        s = start_l[i]
        while stack and end_l[stack[-1]] <= s:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def build_raw_window(
    meta: WindowMeta,
    kineto: KinetoRows | None,
    python: PythonExecutions | None,
    gc_pauses: Sequence[tuple[int, int, int]] = (),
    throttle: Throttle | None = None,
) -> RawWindow:
    """One RawWindow, rows sorted by (start, longest first); parents re-indexed accordingly."""
    tick = (throttle or NoThrottle()).tick
    it = _Interner()
    kind: list[int] = []
    name_id: list[int] = []
    tid: list[int] = []
    device: list[int] = []
    start: list[int] = []
    end: list[int] = []
    stack_id: list[int] = []
    parent: list[int] = []
    nest_group: list[int] = []  # -1: parent already set

    if python is not None:
        base = len(kind)
        for i, codes in enumerate(python.stack):
            tick()
            ids = tuple(it.name(frame_name(c)) for c in codes)
            kind.append(EventKind.PYTHON)
            name_id.append(ids[-1])
            tid.append(meta.training_tid)
            device.append(-1)
            start.append(int(python.start_ns[i]))
            end.append(int(python.end_ns[i]))
            stack_id.append(it.stack(ids))
            p = int(python.parent[i])
            parent.append(base + p if p >= 0 else -1)
            nest_group.append(-1)

    if kineto is not None:
        base = len(kind)
        py_row: dict[int, int] = {}
        for j, pid in enumerate(kineto.python_id):
            if pid >= 0:
                py_row[pid] = base + j
        families: dict[tuple[int, int, int], int] = {}
        py_stack_ids: dict[int, tuple[int, ...]] = {}
        for j in range(len(kineto.kind)):
            tick()
            k = kineto.kind[j]
            nid = it.name(kineto.name[j])
            kind.append(k)
            name_id.append(nid)
            tid.append(kineto.tid[j])
            device.append(kineto.device[j])
            start.append(kineto.start_ns[j])
            end.append(kineto.end_ns[j])
            if k == EventKind.PYTHON:
                prow = py_row.get(kineto.python_parent_id[j], -1)
                parent.append(prow)
                nest_group.append(-1)
                stack_id.append(-1)  # filled below, once every parent row exists
            else:
                parent.append(-1)
                stack_id.append(-1)
                fam = 0 if k in (EventKind.CPU_OP, EventKind.ANNOTATION) else int(k) + 1
                nest_group.append(families.setdefault((kineto.tid[j], kineto.device[j], fam), len(families)))
        # Tracer-mode Python rows: the stack is the chain of parent names.
        for row in py_row.values():
            chain: list[int] = []
            r = row
            while r >= 0 and r not in py_stack_ids:
                chain.append(r)
                r = parent[r]
            prefix = py_stack_ids.get(r, ()) if r >= 0 else ()
            for rr in reversed(chain):
                prefix = prefix + (name_id[rr],)
                py_stack_ids[rr] = prefix
            stack_id[row] = it.stack(py_stack_ids[row])

    for s, e, _gen in gc_pauses:
        if e < meta.window_start_ns or s > meta.window_end_ns:
            continue
        kind.append(EventKind.GC)
        name_id.append(it.name("Python GC"))
        tid.append(meta.training_tid)
        device.append(-1)
        start.append(s)
        end.append(e)
        stack_id.append(-1)
        parent.append(-1)
        nest_group.append(-1)

    cols = {
        "kind": np.array(kind, COLUMNS["kind"]),
        "name_id": np.array(name_id, COLUMNS["name_id"]),
        "tid": np.array(tid, COLUMNS["tid"]),
        "device": np.array(device, COLUMNS["device"]),
        "start_ns": np.array(start, COLUMNS["start_ns"]),
        "end_ns": np.array(end, COLUMNS["end_ns"]),
        "stack_id": np.array(stack_id, COLUMNS["stack_id"]),
        "parent": np.array(parent, COLUMNS["parent"]),
    }
    groups = np.array(nest_group, np.int64)
    nested = groups >= 0
    if nested.any():
        idx = np.nonzero(nested)[0]
        sub = nest_parents(cols["start_ns"][idx], cols["end_ns"][idx], groups[idx], throttle)
        cols["parent"][idx] = np.where(sub >= 0, idx[np.maximum(sub, 0)], -1).astype(np.int32)
    order = np.lexsort((-cols["end_ns"], cols["start_ns"]))
    new_index = np.empty(len(order), np.int64)
    new_index[order] = np.arange(len(order))
    cols = {k: v[order] for k, v in cols.items()}
    p = cols["parent"]
    cols["parent"] = np.where(p >= 0, new_index[np.maximum(p, 0)], -1).astype(np.int32)
    names = tuple(sorted(it.names, key=it.names.__getitem__))
    stacks = tuple(sorted(it.stacks, key=it.stacks.__getitem__))
    return RawWindow(meta=meta, columns=cols, names=names, stacks=stacks)
