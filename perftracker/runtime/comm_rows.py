"""A live window's communication events with the process group each ran in (issue 28). Pure: no
I/O, no torch.

``perftracker.runtime.dist_record`` records, while a window is open, each call of a collective or
point-to-point function (its kind, group and peer, start and end). This module gives each
communication event of the window's ``RawWindow`` the group of the call it belongs to, as
``WindowMeta.comm`` rows (``COMM_FIELDS``), the form an offline trace's ``Process Group Name`` gives:

- an event on the calling thread that starts inside a call (``c10d::allreduce_``, a blocking
  ``gloo:recv``, the Python frames of ``distributed_c10d.py`` that wait for the work) belongs to the
  innermost such call;
- a communication event on another thread (gloo's worker threads) or on a GPU (NCCL kernels)
  belongs to the latest call of the same collective kind that started before it.

An event on the calling thread that no call holds was issued by a call not recorded (DDP's reducer,
a reference to the function taken before the window) and gets no row.

An event no call explains gets no row (the localizer then has no group for it, as for a trace
without groups). A row's sequence number is its call's number among the group's calls in the
window (all rows of one call share it: one collective instance, several events).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from perftracker.model.raw_window import EventKind, RawWindow

# communication events: c10d / gloo / NCCL ops and kernels, and the Python frames of torch's c10d
# layer (the blocking wait of a collective shows there on CPU)
_COMM_NAME = re.compile(r"^(c10d::|c10d_functional::|_c10d_functional::|gloo:|nccl|record_param_comms$|ProcessGroup)"
                        r"|distributed_c10d\.py|c10d_logger\.py|Work objects?>$|_distributed_c10d", re.IGNORECASE)
# canonical kinds, tried in order (the first that the name holds, '_' and case ignored)
_SAMPLED_SLACK_NS = 2_000_000  # a sampled Python frame's start is known to a sample period (1 ms) or two
_KINDS = ("reducescatter", "allgather", "allreduce", "alltoall", "broadcast", "barrier", "sendrecv", "send",
          "recv", "reduce", "gather", "scatter")


class CallLike(Protocol):
    """A recorded call (``perftracker.runtime.dist_record.Call``)."""

    @property
    def kind(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def src(self) -> int: ...
    @property
    def dst(self) -> int: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...
    @property
    def thread(self) -> int: ...  # native thread id of the caller


def collective_kind(name: str) -> str:
    """The collective a name stands for, the same for the Python function (``all_reduce``,
    ``isend``), the c10d op (``c10d::allreduce_``, ``c10d::_allgather_base_``), gloo's event
    (``gloo:all_reduce``) and an NCCL kernel (``ncclDevKernel_AllReduce_Sum_f32``); "" when none."""
    flat = name.lower().replace("_", "")
    flat = flat.rsplit("::", 1)[-1].rsplit(":", 1)[-1] if "nccl" not in flat else flat
    for kind in _KINDS:
        if kind in flat:
            return kind
    return ""


def comm_rows(raw: RawWindow, calls: Sequence[CallLike]) -> tuple[tuple[str, int, int, str, str, int, int, int], ...]:
    """The ``WindowMeta.comm`` rows of ``raw``'s communication events that a recorded call explains."""
    if not calls or len(raw) == 0:
        return ()
    names = raw.names
    is_comm_name = np.array([bool(_COMM_NAME.search(n)) for n in names], dtype=bool)
    name_id = raw.col("name_id").astype(np.int64)
    rows = np.flatnonzero(is_comm_name[name_id] & (raw.col("kind") != int(EventKind.GC)))
    if len(rows) == 0:
        return ()
    order = sorted(range(len(calls)), key=lambda i: calls[i].start_ns)
    call_start = np.array([calls[i].start_ns for i in order], dtype=np.int64)
    by_kind: dict[str, list[int]] = {}
    for j, i in enumerate(order):
        by_kind.setdefault(calls[i].kind, []).append(j)
    kind_starts = {k: call_start[v] for k, v in by_kind.items()}
    seq = np.zeros(len(order), dtype=np.int64)  # each call's number among its group's calls in the window
    count: dict[str, int] = {}
    for j, i in enumerate(order):
        seq[j] = count.get(calls[i].group, 0)
        count[calls[i].group] = int(seq[j]) + 1
    tid, start, end = raw.col("tid"), raw.col("start_ns"), raw.col("end_ns")
    kind_col, device = raw.col("kind"), raw.col("device")
    training = raw.meta.training_tid
    kinds_of_name: dict[int, str] = {}
    out = []
    for r in rows.tolist():
        s = int(start[r])
        nid = int(name_id[r])
        kind = kinds_of_name.get(nid)
        if kind is None:
            kind = kinds_of_name[nid] = collective_kind(names[nid])
        match = -1
        calling = int(tid[r]) == training and int(device[r]) < 0
        if calling:
            # sampled Python frames start up to a sample period early: they match their own kind
            slack = _SAMPLED_SLACK_NS if int(kind_col[r]) == int(EventKind.PYTHON) else 0
            j = int(np.searchsorted(call_start, s + slack, side="right")) - 1
            while j >= 0:  # the innermost call of this thread that holds the event's start
                c = calls[order[j]]
                if c.thread == training and c.start_ns - slack <= s <= c.end_ns and (not kind or c.kind == kind
                                                                                     or not slack):
                    match = j
                    break
                if s - int(call_start[j]) > 60_000_000_000:  # a call older than a minute holds nothing here
                    break
                j -= 1
        if match < 0 and not calling:  # (on the calling thread, no call holds it: a call not recorded)
            for k_name in (kind, "send", "recv") if kind == "sendrecv" else (kind,):  # a fused p2p kernel
                starts = kind_starts.get(k_name)
                if starts is not None:
                    k = int(np.searchsorted(starts, s, side="right")) - 1
                    if k >= 0 and by_kind[k_name][k] > match:
                        match = by_kind[k_name][k]
        if match < 0:
            continue
        c = calls[order[match]]
        out.append((names[nid], s, int(end[r]), c.group, c.kind, int(seq[match]), c.src, c.dst))
    return tuple(out)


def with_recorded_groups(raw: RawWindow, groups: Sequence[tuple[str, str, tuple[int, ...]]],
                         calls: Sequence[CallLike]) -> RawWindow:
    """``raw`` with the process groups and the communication rows of a live window (its meta's
    ``process_groups`` and ``comm``); ``raw`` itself when there is nothing to add."""
    rows = comm_rows(raw, calls)
    if not groups and not rows:
        return raw
    meta = dataclasses.replace(raw.meta, process_groups=tuple(groups) or raw.meta.process_groups,
                               comm=rows or raw.meta.comm)
    return dataclasses.replace(raw, meta=meta)
