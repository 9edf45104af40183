"""`perftracker analyze` on a CPU gloo job's traces: the group of each gloo call (issue 28).

A gloo trace under torch 2.13 lists its rank's process groups (``distributedInfo.pg_config``) but
names no group on its ``gloo:*`` events, so the summarizer sees groups and no collective in any of
them. ``gloo_assignments`` takes every rank's gloo calls and assigns each (rank, event name) a
group where the traces leave one answer (``perftracker.agent.gloo_groups``); ``with_gloo_groups``
then gives a rank's window the ``WindowMeta.comm`` rows that an NCCL trace's ``Process Group Name``
would have given: each gloo call spans its outermost enclosing communication frame on its thread
(the caller's ``distributed_c10d.py`` frames of the same collective that overlap the ``gloo:``
event, which gloo may run on a worker thread, and the generic wrapper around them), and the rows are
made by the live path's own ``comm_rows``. Calls left unassigned get no row (as before).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import numpy as np

from perftracker.agent.gloo_groups import GLOO_PREFIX, Assignment, RankCalls, assign
from perftracker.model.raw_window import RawWindow
from perftracker.runtime.comm_rows import _COMM_NAME, collective_kind, comm_rows
from perftracker.runtime.dist_record import (
    Call,  # the live recorder's call record: one shape for comm_rows
)

ENV = "PERFTRACKER_GLOO_GROUPS"  # "1": `analyze` assigns gloo calls their groups (off by default)


def enabled() -> bool:
    """Whether `perftracker analyze` applies gloo groups: off by default. On this project's 2-core
    host the recorded DP2 x PP2 gloo job (4 ranks) gave, with groups, a per-group finding on every
    clean run (one rank's aten::mm 1.3-2.1x, its data-parallel partner waiting 6-35%: CPU
    contention, invisible offline), against 1 of 4 without; it is for hosts with a core per rank."""
    return os.environ.get(ENV, "").strip() == "1"


def gloo_assignments(by_rank: Mapping[int, RankCalls]) -> tuple[dict[int, dict[str, str]], list[str]]:
    """(rank -> {gloo event name: group}, one line per rank and name left unassigned) for the
    ranks' gloo calls (``gloo_calls``, read by `analyze`'s first pass over each file). A rank
    without its calls (they could not be read) is left out: it then refutes the groups it belongs
    to, and their calls stay unassigned."""
    calls = [by_rank[rank] for rank in sorted(by_rank)]
    if not any(rc.calls for rc in calls):
        return {}, []
    a: Assignment = assign(calls)
    out: dict[int, dict[str, str]] = {}
    for (rank, name), group in a.groups.items():
        out.setdefault(rank, {})[name] = group
    notes = [f"rank {rank}: {name} has no group: {why}" for (rank, name), why in sorted(a.unassigned.items())]
    return out, notes


def with_gloo_groups(raw: RawWindow, groups: Mapping[str, str]) -> RawWindow:
    """``raw`` with the comm rows of its gloo calls whose event name ``groups`` assigns;
    ``raw`` itself when there is none (or when its meta already has comm rows)."""
    if not groups or raw.meta.comm or len(raw) == 0:
        return raw
    names = raw.names
    name_id = raw.col("name_id").astype(np.int64)
    tid, start, end = raw.col("tid"), raw.col("start_ns"), raw.col("end_ns")
    device = raw.col("device")
    is_comm = np.array([bool(_COMM_NAME.search(n)) for n in names], dtype=bool)[name_id] & (device < 0)
    training = raw.meta.training_tid
    on_training = is_comm & (tid == training)
    kinds = np.array([collective_kind(n) for n in names])[name_id]
    calls: list[Call] = []
    for r in np.flatnonzero(is_comm).tolist():
        name = names[int(name_id[r])]
        group = groups.get(name) if name.startswith(GLOO_PREFIX) else None
        if group is None:
            continue
        kind = collective_kind(name)
        s, e = int(start[r]), int(end[r])
        # the caller's frames of this call: same kind, overlapping the gloo event (which gloo may
        # run on a worker thread), then the generic frames (c10d_logger's wrapper) around them
        own = on_training & (kinds == kind) & (start <= e) & (end >= s)
        lo, hi = (int(start[own].min()), int(end[own].max())) if own.any() else (s, e)
        wrap = on_training & (kinds == "") & (start <= lo) & (end >= hi) & (end - start <= (hi - lo) * 2 + 1_000_000)
        if wrap.any():
            lo, hi = int(start[wrap].min()), int(end[wrap].max())
        calls.append(Call(kind, group, -1, -1, min(lo, s), max(hi, e), training))
    if not calls:
        return raw
    rows = comm_rows(raw, calls)
    if not rows:
        return raw
    return dataclasses.replace(raw, meta=dataclasses.replace(raw.meta, comm=rows))

