"""Fault kinds: how each changes the edge weights of a job's timing graph.

Every fault names its ranks and only changes what those ranks do; the effect on the peers comes
from the forward pass alone (they wait in the collectives the culprit joins late).

- ``slow_gpu {factor}``: the rank's compute kernels (every kernel that is not NCCL) take
  ``factor`` times as long: a throttled or slow GPU.
- ``slow_link {factor}``: the transfer time of every collective instance the rank joins is
  ``factor`` times as long, for all its members (a ring is as fast as its slowest link): every
  member's end comes (factor - 1) x the transfer time later than its dependencies allow.
- ``host_stall {ms, before}``: the main thread spends ``ms`` more just before the first event of
  each step whose name contains ``before``; launches after it come later, so the GPU idles.
- ``slow_memcpy {factor}``: the rank's GPU copies and memsets take ``factor`` times as long.
- ``gc_pause {ms, every}``: every ``every``-th step, the main thread pauses ``ms`` before one of
  its ops, picked with a seeded RNG (a garbage-collection pause at an arbitrary point).
- ``imbalance {factor, name}``: kernels whose name contains ``name`` take ``factor`` times as
  long on the rank: more work in that part of the model.
- ``throttle {clock, reason, factor}``: the rank's GPU runs at ``clock`` of its maximum SM clock
  for ``reason`` ("thermal", "power" or "sw"), and its compute kernels take ``factor`` times as long
  (1.0: kernels bound by memory or latency, or off the critical path, keep their time: the β stays).
  The clock and the reason show only in the hardware series (bench/tracefault/hwseries.py).

Every fault also shapes the hardware series written beside each rank's trace (hwseries.py): a
throttled GPU its clock and reasons, a slow link the link rate of every member of the instances it
slows and, on the rank's own port, ``port_xmit_wait``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.tracefault.build import JobGraph
from bench.tracefault.graph import CHAIN, DURATION, LAUNCH, TRANSFER
from perftracker.errors import ConfigError

KINDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "slow_gpu": {"factor": (int, float)},
    "slow_link": {"factor": (int, float)},
    "host_stall": {"ms": (int, float), "before": str},
    "slow_memcpy": {"factor": (int, float)},
    "gc_pause": {"ms": (int, float), "every": int},
    "imbalance": {"factor": (int, float), "name": str},
    "throttle": {"clock": (int, float), "reason": str, "factor": (int, float)},
}
THROTTLE_REASONS = ("thermal", "power", "sw")


@dataclass(frozen=True)
class GpuFault:
    kind: str
    ranks: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"fault kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        spec = KINDS[self.kind]
        missing = sorted(set(spec) - set(self.params))
        if missing:
            raise ConfigError(f"{self.kind} needs {missing}")
        for k, v in self.params.items():
            if k not in spec:
                raise ConfigError(f"{self.kind} takes {sorted(spec)}, not {k!r}")
            if isinstance(v, bool) or not isinstance(v, spec[k]):
                raise ConfigError(f"{self.kind}.{k}: bad value {v!r}")
        if "factor" in self.params and self.params["factor"] <= 0:
            raise ConfigError(f"{self.kind}.factor must be > 0")
        if "ms" in self.params and self.params["ms"] < 0:
            raise ConfigError(f"{self.kind}.ms must be >= 0")
        if self.kind == "throttle" and not (0 < self.params["clock"] <= 1):
            raise ConfigError(f"throttle.clock must be in (0, 1], got {self.params['clock']!r}")
        if self.kind == "throttle" and self.params["reason"] not in THROTTLE_REASONS:
            raise ConfigError(f"throttle.reason must be one of {list(THROTTLE_REASONS)}, got {self.params['reason']!r}")
        if "every" in self.params and self.params["every"] < 1:
            raise ConfigError(f"{self.kind}.every must be >= 1")


def apply_faults(jg: JobGraph, faults: tuple[GpuFault, ...] | list[GpuFault], seed: int = 0,
                 ranks_per_host: int = 0) -> np.ndarray:
    """The mutated edge weights (µs) for the given faults (``ranks_per_host``: see ``link_factors``)."""
    g = jg.graph
    w = g.w0_us.copy()
    ev = jg.events
    ev_rank = np.fromiter((e.rank for e in ev), dtype=np.int64, count=len(ev))
    src_ev = g.src // 2
    dst_ev = g.dst // 2
    present = set(ev_rank.tolist())
    for f in faults:
        missing = sorted(set(f.ranks) - present)
        if missing:
            raise ConfigError(f"{f.kind}: ranks {missing} are not in the trace set (ranks {sorted(present)})")
        ranks = np.asarray(f.ranks, dtype=np.int64)
        k = f.kind
        if k in ("slow_gpu", "slow_memcpy", "imbalance", "throttle"):
            if k in ("slow_gpu", "throttle"):
                sel = np.fromiter((e.cat == "kernel" and not e.nccl for e in ev), dtype=bool, count=len(ev))
            elif k == "slow_memcpy":
                sel = np.fromiter((e.cat in ("gpu_memcpy", "gpu_memset") for e in ev), dtype=bool, count=len(ev))
            else:
                needle = str(f.params["name"]).lower()
                sel = np.fromiter((e.cat == "kernel" and not e.nccl and needle in e.name.lower() for e in ev),
                                  dtype=bool, count=len(ev))
                if not (sel & np.isin(ev_rank, ranks)).any():
                    raise ConfigError(f"imbalance: no compute kernel named like {f.params['name']!r} on ranks {list(f.ranks)}")
            m = (g.kind == DURATION) & sel[src_ev] & np.isin(ev_rank[src_ev], ranks)
            w[m] *= float(f.params["factor"])
        elif k == "slow_link":
            pass  # link_factors below
        elif k in ("host_stall", "gc_pause"):
            launching = set(ev_rank[dst_ev[g.kind == LAUNCH]].tolist())
            for r in f.ranks:
                if r not in launching:  # a converted trace: the pause is the host event itself
                    nodes = _pause_nodes(jg, r, k, f.params, seed)
                else:
                    nodes = (_stall_nodes(jg, r, str(f.params["before"])) if k == "host_stall"
                             else _gc_nodes(jg, r, int(f.params["every"]), seed))
                for v in nodes:
                    m = (g.dst == v) & (g.kind == CHAIN)
                    if not m.any():
                        raise ConfigError(f"{k}: rank {r}: the chosen point has no host predecessor")
                    w[m] += float(f.params["ms"]) * 1000.0
    link = link_factors(jg, faults, ranks_per_host)
    tm = (g.kind == TRANSFER) & (jg.edge_instance >= 0)
    transfer_us = np.array([inst.transfer_us for inst in jg.instances], dtype=np.float64)
    inst_of = jg.edge_instance[tm]
    # the transfer takes `factor` times as long: (factor - 1) x its time more on every edge (an edge
    # held below the transfer time by contradicting input keeps its slack)
    w[tm] = g.w0_us[tm] + (link[inst_of] - 1.0) * transfer_us[inst_of]
    del dst_ev
    return w


def link_factors(jg: JobGraph, faults: tuple[GpuFault, ...] | list[GpuFault], ranks_per_host: int = 0) -> np.ndarray:
    """Per collective instance: how many times as long its transfer takes (``slow_link``: the
    largest factor among the faults that name one of its members' ranks; 1.0 elsewhere). With
    ``ranks_per_host`` (> 0, ranks filling hosts in order) the slow link is the rank's NIC: only the
    instances whose members span hosts are slowed, those inside its host (NVLink) keep their time."""
    link = np.ones(len(jg.instances))
    for f in faults:
        if f.kind != "slow_link":
            continue
        for i, inst in enumerate(jg.instances):
            ranks = {jg.events[m].rank for m in inst.members}
            if ranks_per_host > 0 and len({r // ranks_per_host for r in ranks}) < 2:
                continue
            if ranks & set(f.ranks):
                link[i] = max(link[i], float(f.params["factor"]))
    return link


def _main_events(jg: JobGraph, rank: int) -> list[int]:
    tid = jg.main_tid.get(rank)
    return [i for i, e in enumerate(jg.events) if e.rank == rank and not e.gpu and e.lane[1] == tid]


def _stall_nodes(jg: JobGraph, rank: int, before: str) -> list[int]:
    """The start node of the first main-thread event per step whose name contains ``before``."""
    needle = before.lower()
    first: dict[int, int] = {}
    for i in _main_events(jg, rank):
        e = jg.events[i]
        if needle in e.name.lower() and (e.tile not in first or e.start_us < jg.events[first[e.tile]].start_us):
            first[e.tile] = i
    if not first:
        raise ConfigError(f"host_stall: rank {rank} has no main-thread event named like {before!r}")
    return [2 * i for i in first.values()]


def _pause_nodes(jg: JobGraph, rank: int, kind: str, params: dict[str, Any], seed: int) -> list[int]:
    """On a rank whose GPU work has no launches (a converted trace: its host events are the ops
    its authors recorded on the worker's timeline, the garbage collections), the pause is the host
    event itself, made ``ms`` longer (the end node of each chosen event; the GPU work recorded after
    it waits for its end: build._recorded_host_order). ``host_stall``: every main-thread event named
    like ``before`` (one per recorded step); ``gc_pause``: every ``every``-th garbage collection
    (events named like "gc" or "collect"), from a seeded-random one of the first ``every``."""
    events = sorted(_main_events(jg, rank), key=lambda i: jg.events[i].start_us)
    if kind == "host_stall":
        needle = str(params["before"]).lower()
        chosen = [i for i in events if needle in jg.events[i].name.lower()]
    else:
        gcs = [i for i in events if "collect" in jg.events[i].name.lower() or "gc" in jg.events[i].name.lower()]
        every = int(params["every"])
        first = random.Random(f"{seed}:{rank}").randrange(min(every, len(gcs))) if gcs else 0
        chosen = gcs[first::every]
    if not chosen:
        raise ConfigError(f"{kind}: rank {rank} has no main-thread event to pause "
                          f"({'named like ' + repr(params['before']) if kind == 'host_stall' else 'no garbage collection'})")
    return [2 * i + 1 for i in chosen]


def _gc_nodes(jg: JobGraph, rank: int, every: int, seed: int) -> list[int]:
    """One seeded-random main-thread op start in every ``every``-th step."""
    per_tile: dict[int, list[int]] = {}
    for i in _main_events(jg, rank):
        e = jg.events[i]
        if e.cat == "cpu_op":
            per_tile.setdefault(e.tile, []).append(i)
    nodes = []
    for t in sorted(per_tile):
        if (t + 1) % every:
            continue
        cand = sorted(per_tile[t], key=lambda i: jg.events[i].start_us)
        rng = random.Random(f"{seed}:{rank}:{t}")
        nodes.append(2 * cand[rng.randrange(len(cand))])
    if not nodes:
        raise ConfigError(f"gc_pause: rank {rank}: no step {every} or later with main-thread ops (use more --steps)")
    return nodes
