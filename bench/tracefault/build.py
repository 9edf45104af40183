"""Build the timing graph of a multi-rank trace set (see graph.py for the solve).

The dependencies, per rank:

- **stream order**: events on one CUDA stream (device, stream) run one after another, except
  those that ran together in the input (the two kernels a converted trace writes for one batched
  send/recv): each waits for the latest event that had ended by its start;
- **duration**: a GPU event that is not a collective ends its (possibly scaled) duration after it starts;
- **launch**: a kernel or memcpy starts no earlier than its runtime launch call (ac2g flow /
  correlation id) plus the rank's shortest observed launch latency;
- **stream waits**: after a ``cudaStreamWaitEvent`` the next GPU event the process launches
  starts no earlier than the end of the work launched before it on the device's other streams,
  where the input does not contradict it (that work ended before the event started);
- **recorded stream order**, only on a rank whose trace has no launches (converted traces): a GPU
  event starts no earlier than the end of the last event of each other stream of its device that
  had ended before it started (a send waits for the compute that made its data, compute for the
  receive that brought its input); work that overlapped in the input stays free to overlap;
- **host**: the process's CPU time points (starts and ends of its ops, runtime calls and
  annotations, all threads merged in time order: Python runs one thread at a time and the
  main thread blocks in ``backward()`` while autograd runs) follow one another with their recorded
  gaps;
- **synchronization**: ``cudaStreamSynchronize``/``cudaEventSynchronize`` (the stream of the
  thread's last launch), ``cudaDeviceSynchronize`` (every stream of the device) and blocking
  copies (``cudaMemcpy``, or a copy to/from pageable memory) end no earlier than the GPU work they
  wait for. A call that waited in the input keeps only its tail after the GPU work; one that did
  not wait keeps its duration.

Across ranks, **collectives**: the k-th NCCL kernel of one process group on each member rank is
one instance (the group from the kernel's own args, else from ``record_param_comms`` args where the
trace has them, otherwise all ranks). Point-to-point kernels that name their ``Src Rank``
and ``Dst Rank`` are paired per directed channel in issue order (the k-th send of the source with
the k-th recv of the destination; ``Seq`` is a per-rank counter and pairs nothing); other SendRecv
instances without group ranks are split into the peer sets that ended together in the input.
Dependencies that the recorded order contradicts (they close a cycle) are dropped with a note
(graph.acyclic_edges), so any trace set is re-timed. Each member ends at the members' latest start plus the instance's transfer time, the
shortest member duration in the input.
"""

from __future__ import annotations

import bisect
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.tracefault.graph import (
    CHAIN,
    DURATION,
    KIND_NAMES,
    LAUNCH,
    STREAM,
    SYNC,
    TRANSFER,
    WAIT,
    EdgeList,
    TimingCycleError,
    TimingGraph,
    acyclic_edges,
    residuals,
    topological_order,
)
from bench.tracefault.traces import GPU_CATS, RUNTIME_CATS, RankTrace, is_modelled

log = logging.getLogger(__name__)

_STREAM_SYNC = ("cudaStreamSynchronize", "cudaEventSynchronize")
_DEVICE_SYNC = ("cudaDeviceSynchronize", "cudaCtxSynchronize")
_PG_NAME_KEYS = ("Process Group Name", "pg_name", "Process Group Description")
_PG_RANKS_KEYS = ("Process Group Ranks", "pg_ranks", "Group ranks")
_SENDRECV_END_TOL_US = 10.0


@dataclass
class Event:
    """One modelled event: nodes 2*i (start) and 2*i+1 (end) of the graph."""

    rank: int
    ref: dict[str, Any]  # the trace event (rewritten on output)
    start_us: float  # relative to the job origin
    end_us: float
    gpu: bool
    nccl: bool
    tile: int
    lane: tuple[Any, Any]  # (pid, stream) for GPU events, (pid, tid) for host events

    @property
    def name(self) -> str:
        return str(self.ref.get("name", ""))

    @property
    def cat(self) -> str:
        return str(self.ref.get("cat", ""))


@dataclass
class Instance:
    """One collective instance: its member events (indices into the event list), one per rank."""

    group: str
    index: int
    members: list[int]
    transfer_us: float


@dataclass
class JobGraph:
    graph: TimingGraph
    events: list[Event]
    instances: list[Instance]
    edge_instance: np.ndarray  # per edge: the instance index of a TRANSFER edge, else -1
    origin_us: float  # absolute time of relative 0
    main_tid: dict[int, Any]  # rank -> its main thread id
    residual_us: np.ndarray  # per node (see graph.py); copies of the step inherit the recorded step's
    has_in: np.ndarray  # per node: whether it has in-edges
    notes: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return 1 + max((e.tile for e in self.events), default=0)


def _stream(e: dict[str, Any]) -> Any:
    args = e.get("args") or {}
    return args.get("stream", e.get("tid"))


def _corr(e: dict[str, Any]) -> int | None:
    args = e.get("args")
    v = args.get("correlation") if isinstance(args, dict) else None
    return v if isinstance(v, int) else None


def main_thread(rt: RankTrace) -> Any:
    """The training thread: the one with ProfilerStep# annotations, else tid == pid, else the busiest."""
    counts: dict[Any, int] = defaultdict(int)
    steps: dict[Any, int] = defaultdict(int)
    pids = set()
    for e in rt.events:
        if is_modelled(e) and e.get("cat") not in GPU_CATS:
            counts[e.get("tid")] += 1
            pids.add(e.get("pid"))
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                steps[e.get("tid")] += 1
    if steps:
        return max(steps, key=lambda t: steps[t])
    for p in pids:
        if p in counts:
            return p
    return max(counts, key=lambda t: counts[t]) if counts else None


def _group_of(rpc: dict[str, Any] | None, world: list[int]) -> tuple[str, list[int], bool]:
    """(group key, member ranks, whether the members were given) from a record_param_comms op."""
    args = (rpc or {}).get("args") or {}
    name = next((str(args[k]) for k in _PG_NAME_KEYS if k in args), "")
    ranks: list[int] | None = None
    for k in _PG_RANKS_KEYS:
        if k in args:
            v = args[k]
            if isinstance(v, str):
                try:
                    v = json.loads(v)
                except ValueError:
                    v = None
            if isinstance(v, list) and all(isinstance(x, int) for x in v):
                ranks = v
            break
    if ranks is not None:
        return name or ",".join(map(str, ranks)), ranks, True
    return name or "all", list(world), False


def build(ranks: list[RankTrace]) -> JobGraph:
    """The timing graph of all ranks' modelled events."""
    origin = min(e["ts"] for rt in ranks for e in rt.events if is_modelled(e))
    events: list[Event] = []
    edges = EdgeList()
    main_tid: dict[int, Any] = {}
    nccl_by_rank: dict[int, list[tuple[str, list[int], bool, int]]] = {}
    notes: list[str] = []
    world = [rt.rank for rt in ranks]
    for rt in ranks:
        main_tid[rt.rank] = main_thread(rt)
        first = len(events)
        for e, c in zip(rt.events, rt.tile, strict=True):
            if not is_modelled(e):
                continue
            s = float(e["ts"] - origin)
            gpu = e.get("cat") in GPU_CATS
            nccl = gpu and e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()
            lane = (e.get("pid"), _stream(e)) if gpu else (e.get("pid"), e.get("tid"))
            events.append(Event(rt.rank, e, s, s + float(e.get("dur", 0)), gpu, nccl, c, lane))
        nccl_by_rank[rt.rank] = _rank_edges(events, first, len(events), edges, world, notes)
    instances, edge_inst = _collective_edges(events, nccl_by_rank, edges, notes)
    edges, edge_inst = _without_cycles(events, edges, edge_inst, notes)
    t_in = np.empty(2 * len(events))
    t_in[0::2] = [ev.start_us for ev in events]
    t_in[1::2] = [ev.end_us for ev in events]
    g = TimingGraph.from_edges(t_in, edges)
    inst_arr = np.full(len(edges.src), -1, dtype=np.int64)
    for ei, k in edge_inst.items():
        inst_arr[ei] = k
    r, has_in = residuals(g)
    _inherit_residuals(events, r, has_in)
    return JobGraph(g, events, instances, inst_arr, float(origin), main_tid, r, has_in, notes)


def _without_cycles(events: list[Event], edges: EdgeList, edge_inst: dict[int, int], notes: list[str]
                    ) -> tuple[EdgeList, dict[int, int]]:
    """The edges less those that close a cycle (graph.acyclic_edges: a dependency the recorded
    order contradicts), with a note per kind saying what was relaxed; a trace set whose order the
    model cannot keep exactly is still re-timed (identity stays exact: the residuals are taken
    from the edges that are kept)."""
    t_in = np.empty(2 * len(events))
    t_in[0::2] = [ev.start_us for ev in events]
    t_in[1::2] = [ev.end_us for ev in events]
    g = TimingGraph.from_edges(t_in, edges)
    try:
        topological_order(g)
        return edges, edge_inst
    except TimingCycleError:
        keep = acyclic_edges(g)
    dropped = np.flatnonzero(~keep)
    kinds = np.bincount(np.asarray(edges.kind, dtype=np.int64)[dropped], minlength=len(KIND_NAMES))
    what = ", ".join(f"{int(c)} {KIND_NAMES[k]}" for k, c in enumerate(kinds) if c)
    notes.append(f"relaxed {len(dropped)} of {len(edges.src)} dependencies that the recorded order "
                 f"contradicts (they closed a cycle): {what}")
    out = EdgeList()
    remap: dict[int, int] = {}
    for i in np.flatnonzero(keep).tolist():
        j = out.add(edges.src[i], edges.dst[i], edges.w0[i], edges.kind[i])
        if i in edge_inst:
            remap[j] = edge_inst[i]
    return out, remap


def _inherit_residuals(events: list[Event], r: np.ndarray, has_in: np.ndarray) -> None:
    """Copies 1.. of a tiled step take each node's residual from the recorded step (copy 0): the
    copies are the model's steady state, not the recorded start-up offsets repeated. A node that had
    no in-edge in the recorded step (a trace's first event) gets residual 0 in the copies, where it
    follows the previous copy directly. In place."""
    per: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, ev in enumerate(events):
        per[(ev.rank, ev.tile)].append(i)
    for (rank, c), idx in per.items():
        if c == 0:
            continue
        base = per[(rank, 0)]
        if len(base) != len(idx):  # cannot happen for tile()'s output; keep the computed residuals
            continue
        src = np.asarray(base, dtype=np.int64)
        dst = np.asarray(idx, dtype=np.int64)
        for off in (0, 1):
            r[2 * dst + off] = np.where(has_in[2 * src + off], r[2 * src + off], 0.0)


def _rank_edges(events: list[Event], lo: int, hi: int, edges: EdgeList, world: list[int],
                notes: list[str]) -> list[tuple[str, list[int], bool, int]]:
    """One rank's intra-rank edges; returns its NCCL kernels in start order with their groups."""
    idx = range(lo, hi)
    gpu = [i for i in idx if events[i].gpu]
    host = [i for i in idx if not events[i].gpu]
    # --- GPU: duration and stream order
    lanes: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for i in gpu:
        lanes[events[i].lane].append(i)
        if not events[i].nccl:
            edges.add(2 * i, 2 * i + 1, events[i].end_us - events[i].start_us, DURATION)
    for lst in lanes.values():
        lst.sort(key=lambda i: (events[i].start_us, events[i].end_us))
        for k in range(1, len(lst)):
            a = _stream_predecessor(events, lst, k)
            if a is not None:
                edges.add(2 * a + 1, 2 * lst[k], 0.0, STREAM)
    # --- launches (correlation ids)
    runtime_by_corr: dict[int, int] = {}
    for i in host:
        if events[i].cat in RUNTIME_CATS and (c := _corr(events[i].ref)) is not None:
            runtime_by_corr[c] = i
    launched: dict[int, int] = {}  # runtime event -> GPU event
    for i in gpu:
        c = _corr(events[i].ref)
        if c is not None and c in runtime_by_corr:
            launched[runtime_by_corr[c]] = i
    lags = [events[g].start_us - events[r].start_us for r, g in launched.items()]
    min_lag = max(0.0, min(lags)) if lags else 0.0
    for r, g in launched.items():
        edges.add(2 * r, 2 * g, min_lag, LAUNCH)
    # launch order per stream, and per host thread
    stream_launches: dict[tuple[Any, Any], list[tuple[float, int]]] = defaultdict(list)
    thread_launches: dict[Any, list[tuple[float, int]]] = defaultdict(list)
    for r, g in launched.items():
        stream_launches[events[g].lane].append((events[r].start_us, g))
        thread_launches[events[r].lane].append((events[r].start_us, g))
    for v in (*stream_launches.values(), *thread_launches.values()):
        v.sort()

    def last_launched_before(lane: tuple[Any, Any], t: float) -> int | None:
        lst = stream_launches.get(lane, [])
        k = bisect.bisect_left(lst, (t, -1))
        return lst[k - 1][1] if k else None

    # --- stream waits: the waiting stream is not in the trace; the process's next launch is the
    # first work enqueued after the wait (the autograd thread waits for a gradient all-reduce and
    # the main thread's optimizer launches next)
    process_launches: dict[Any, list[tuple[float, int]]] = defaultdict(list)
    for r, g in launched.items():
        process_launches[events[r].lane[0]].append((events[r].start_us, g))
    for v in process_launches.values():
        v.sort()
    n_wait = 0
    for i in host:
        ev = events[i]
        if ev.name != "cudaStreamWaitEvent":
            continue
        lst = process_launches.get(ev.lane[0], [])
        k = bisect.bisect_right(lst, (ev.start_us, len(events)))
        if k >= len(lst):
            continue
        v = lst[k][1]
        for lane in stream_launches:
            if lane == events[v].lane or lane[0] != events[v].lane[0]:
                continue
            u = last_launched_before(lane, ev.start_us)
            if u is not None and events[u].end_us <= events[v].start_us + 1.0:
                edges.add(2 * u + 1, 2 * v, 0.0, WAIT)
                n_wait += 1
    # --- host: one merged chain per process, with synchronizing calls
    sync_wait: dict[int, list[int]] = {}
    for i in host:
        ev = events[i]
        if ev.cat not in RUNTIME_CATS:
            continue
        waited: list[int] = []
        if ev.name in _STREAM_SYNC:
            lst = thread_launches.get(ev.lane, [])
            k = bisect.bisect_left(lst, (ev.start_us, -1))
            if k:
                u = last_launched_before(events[lst[k - 1][1]].lane, ev.start_us)
                if u is not None:
                    waited.append(u)
        elif ev.name in _DEVICE_SYNC:
            for lane in stream_launches:
                u = last_launched_before(lane, ev.start_us)
                if u is not None:
                    waited.append(u)
        elif ev.name.startswith("cudaMemcpy") and i in launched:
            g = launched[i]
            if not ev.name.endswith("Async") or "pageable" in events[g].name.lower():
                waited.append(g)
        if waited:
            sync_wait[i] = waited
    gpu_only = bool(gpu) and not launched
    by_pid: dict[Any, list[tuple[float, float, float, int]]] = defaultdict(list)
    for i in host:
        ev = events[i]
        # ends before starts at one instant; inner ends before outer ends; outer starts before inner;
        # on a launch-less rank a zero-length event (a converted GC marker) starts before it ends,
        # after the ends and before the starts of its instant (a pause lengthens it: faults.py)
        zero = gpu_only and ev.end_us <= ev.start_us
        by_pid[ev.lane[0]].append((ev.start_us, 0.25 if zero else 1, -ev.end_us, 2 * i))
        by_pid[ev.lane[0]].append((ev.end_us, 0.5 if zero else 0, -ev.start_us, 2 * i + 1))
    for pts in by_pid.values():
        pts.sort()
        prev: tuple[float, int] | None = None
        for t, _, _, node in pts:
            i = node // 2
            if node % 2 == 1 and i in sync_wait:
                ev = events[i]
                g_end = max(events[u].end_us for u in sync_wait[i])
                if g_end >= ev.start_us:  # it waited: keep the tail after the GPU work
                    w_chain, w_gpu = max(0.0, ev.end_us - g_end), ev.end_us - g_end
                else:
                    w_chain = w_gpu = ev.end_us - ev.start_us
                edges.add(node - 1, node, w_chain, CHAIN)
                for u in sync_wait[i]:
                    edges.add(2 * u + 1, node, w_gpu, SYNC)
            elif prev is not None:
                # a copy of the step follows the previous copy directly; on a rank whose GPU work
                # has no launches the host's gaps are no work of its own (its events sit among the
                # GPU work: _recorded_host_order), only its order is kept
                gap = 0.0 if events[prev[1] // 2].tile != events[i].tile or gpu_only else t - prev[0]
                edges.add(prev[1], node, gap, CHAIN)
            prev = (t, node)
    if host and not launched:
        notes.append(f"rank {events[lo].rank}: no launch correlation between host and GPU events")
    if not launched:
        n_order = _recorded_stream_order(events, lanes, edges)
        n_host = _recorded_host_order(events, lanes, host, edges)
        log.debug("rank %s: no launches, %d cross-stream order edges, %d host-device", events[lo].rank, n_order, n_host)
    # --- NCCL kernels with their groups (record_param_comms on the launching thread, by time)
    rpcs: dict[Any, list[tuple[float, float, int]]] = defaultdict(list)
    for i in host:
        if events[i].name == "record_param_comms":
            rpcs[events[i].lane].append((events[i].start_us, events[i].end_us, i))
    for v in rpcs.values():
        v.sort()
    launcher = {g: r for r, g in launched.items()}
    out = []
    for g in sorted((i for i in gpu if events[i].nccl), key=lambda i: events[i].start_us):
        rpc = None
        r = launcher.get(g)
        if r is not None:
            lst = rpcs.get(events[r].lane, [])
            k = bisect.bisect_right(lst, (events[r].start_us, np.inf, len(events)))
            while k > 0:
                s, e, j = lst[k - 1]
                if e >= events[r].end_us:
                    rpc = events[j].ref
                    break
                k -= 1
                if events[r].start_us - s > 1e6:
                    break
        own = events[g].ref.get("args") or {}
        # the kernel's own group fields (PyTorch >= 2.2 writes them on NCCL kernels too) win
        key, members, given = _group_of(events[g].ref if any(k in own for k in _PG_NAME_KEYS) else rpc, world)
        out.append((key, members, given, g))
    log.debug("rank %s: %d launches (min lag %.1f us), %d stream waits, %d syncs", events[lo].rank if hi > lo else "?",
              len(launched), min_lag, n_wait, len(sync_wait))
    return out


def _stream_predecessor(events: list[Event], lst: list[int], k: int) -> int | None:
    """The event the k-th of a stream (start order) waits for: the one before it, unless the two ran
    together in the input (it started more than 1 µs before the previous one ended: the two halves
    of a batched send/recv, which a converted trace writes as two kernels of one stream with the
    same start); then the latest earlier event that had ended by its start, or none. Chained one
    after the other, a batched recv waited for its send's peer: on the sa_se traces, rank 10 slowed,
    its partner's recv started only when its send ended, 0.6 ms later."""
    b = lst[k]
    start = events[b].start_us + 1.0
    if events[lst[k - 1]].end_us <= start:
        return lst[k - 1]
    best: int | None = None
    for a in lst[max(0, k - 8):k]:  # overlaps are short runs of batched kernels
        if events[a].end_us <= start and (best is None or events[a].end_us >= events[best].end_us):
            best = a
    return best


def _recorded_stream_order(events: list[Event], lanes: dict[tuple[Any, Any], list[int]],
                           edges: EdgeList) -> int:
    """A rank whose trace has no launches (converted traces: GPU events only) keeps its device's
    cross-stream order as recorded: a GPU event starts no earlier than the end of the last event of
    each other stream of its device that had ended (within 1 µs) before it started. Without launches
    and stream waits nothing else says that a send on the communication stream waits for the compute
    that produced its data, or that compute waits for the receive that brought its input; the
    streams would run apart, a slowed compute stream past the rank's last collective with no one
    waiting for it. Work that overlapped in the input (started before the other stream's event
    ended) gets no edge and stays free to overlap. An edge the previous event of the same stream
    already implies is left out. Returns the number of edges added."""
    by_dev: dict[Any, list[tuple[Any, Any]]] = defaultdict(list)
    for lane in lanes:
        by_dev[lane[0]].append(lane)
    ends: dict[tuple[Any, Any], tuple[list[float], list[int]]] = {}
    for lane, lst in lanes.items():
        srt = sorted(lst, key=lambda i: events[i].end_us)
        ends[lane] = ([events[i].end_us for i in srt], srt)
    n = 0
    for dev_lanes in by_dev.values():
        if len(dev_lanes) < 2:
            continue
        for lane in dev_lanes:
            last_dep: dict[tuple[Any, Any], int] = {}
            lst = lanes[lane]
            for k, v in enumerate(lst):
                if k and _stream_predecessor(events, lst, k) != lst[k - 1]:
                    last_dep = {}  # it ran with the previous event (a batched send/recv): not implied by it
                for other in dev_lanes:
                    if other == lane:
                        continue
                    e_us, idx = ends[other]
                    k = bisect.bisect_right(e_us, events[v].start_us + 1.0)
                    while k and _order_key(events, idx[k - 1]) >= _order_key(events, v):
                        k -= 1  # two events within 1 µs of each other: only the earlier waits for nothing
                    if not k:
                        continue
                    u = idx[k - 1]
                    if last_dep.get(other) == u:
                        continue  # the same stream's previous event already waits for it
                    last_dep[other] = u
                    edges.add(2 * u + 1, 2 * v, 0.0, WAIT)
                    n += 1
    return n


def _recorded_host_order(events: list[Event], lanes: dict[tuple[Any, Any], list[int]], host: list[int],
                         edges: EdgeList) -> int:
    """A rank whose trace has no launches keeps its host events where the recorded order puts them
    among its GPU work: a host event starts no earlier than the end of the last event of each
    stream that had ended (within 1 µs) by its start, and the first event of each stream that
    started (within 1 µs) after its end waits for it. In a converted trace (sa_se, sa_st) the
    host's only events are the garbage collections the authors recorded as ops of the worker's
    timeline: without this they kept their recorded times whatever the GPU did (a faster stage
    ended its step before them, and the job's span, pinned by the last one, did not move) and a
    pause added on the host delayed nothing. Returns the number of edges added."""
    if not host:
        return 0
    n = 0
    for lst in lanes.values():
        ends = sorted(lst, key=lambda i: events[i].end_us)
        end_us = [events[i].end_us for i in ends]
        starts = sorted(lst, key=lambda i: events[i].start_us)
        start_us = [events[i].start_us for i in starts]
        for h in host:
            k = bisect.bisect_right(end_us, events[h].start_us + 1.0)
            while k and _order_key(events, ends[k - 1]) >= _order_key(events, h):
                k -= 1  # within 1 µs of each other: only the earlier waits for nothing (no cycle)
            if k:  # into its start and its end: a zero-length event's end comes first in the host chain
                edges.add(2 * ends[k - 1] + 1, 2 * h, 0.0, WAIT)
                edges.add(2 * ends[k - 1] + 1, 2 * h + 1, 0.0, WAIT)
                n += 2
            k = bisect.bisect_left(start_us, events[h].end_us - 1.0)
            if k < len(starts) and _order_key(events, starts[k]) > _order_key(events, h):
                edges.add(2 * h + 1, 2 * starts[k], 0.0, WAIT)
                n += 1
    return n


def _order_key(events: list[Event], i: int) -> tuple[float, float, int]:
    """A total order of one rank's events by time: cross-stream order edges only go forward in it,
    so they can close no cycle among themselves."""
    return events[i].start_us, events[i].end_us, i


def _is_p2p(name: str) -> bool:
    n = name.lower()
    return "send" in n or "recv" in n


def _collective_edges(events: list[Event], nccl_by_rank: dict[int, list[tuple[str, list[int], bool, int]]],
                      edges: EdgeList, notes: list[str]) -> tuple[list[Instance], dict[int, int]]:
    """Collective instances: the k-th NCCL kernel of a group on each member rank. Point-to-point
    kernels (SendRecv, Send, Recv) of a group whose ranks the trace does not give are paired by
    when they ended instead: a transfer ends on both sides at once, and ranks need not run the same
    number of them (pipeline stages)."""
    seqs: dict[str, dict[int, list[tuple[list[int], bool, int]]]] = defaultdict(lambda: defaultdict(list))
    pooled: dict[str, list[int]] = defaultdict(list)
    by_peer: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for rank, lst in nccl_by_rank.items():
        for key, members, given, g in lst:
            peer = _p2p_peer(events[g], key)
            if peer is not None:
                by_peer[peer[:3]].append(g)
            elif not given and _is_p2p(events[g].name):
                pooled[key].append(g)
            else:
                seqs[key][rank].append((members, given, g))
    instances: list[Instance] = []
    edge_inst: dict[int, int] = {}

    def add(key: str, k: int, grp: list[int]) -> None:
        t = min(events[g].end_us - events[g].start_us for g in grp)
        inst = len(instances)
        instances.append(Instance(key, k, grp, t))
        for m in grp:
            for j in grp:
                # an edge the input contradicts (member j started less than t before m ended: the
                # ranks' clocks disagree) is held to what the input shows, so that no end node
                # carries a negative residual (it put ends before starts once a fault lengthened t)
                w0 = min(t, events[m].end_us - events[j].start_us)
                edge_inst[edges.add(2 * j, 2 * m + 1, w0, TRANSFER)] = inst

    for key, per_rank in seqs.items():
        counts = {r: len(v) for r, v in per_rank.items()}
        if len(set(counts.values())) > 1:
            notes.append(f"group {key}: ranks have different numbers of NCCL collectives {counts}; "
                         "matching the k-th of each")
        for k in range(max(counts.values())):
            at = {r: v[k] for r, v in per_rank.items() if k < len(v)}
            members_given = next((m for m, given, _ in at.values() if given), None)
            add(key, k, [at[r][2] for r in sorted(at) if members_given is None or r in members_given])
    for key, gs in pooled.items():
        for k, grp in enumerate(_pair_by_end(events, gs)):
            add(key, k, grp)
    for (key, src, dst), gs in sorted(by_peer.items()):
        for k, pair in enumerate(_pair_in_order(events, gs, src, dst, f"{key}:{src}->{dst}", notes)):
            add(f"{key}:{src}->{dst}", k, pair)  # a send and its recv: one transfer
    return instances, edge_inst


def _pair_in_order(events: list[Event], kernels: list[int], src: int, dst: int, label: str,
                   notes: list[str]) -> list[list[int]]:
    """The transfers of one directed channel (group, source rank, destination rank): the k-th send
    on the source with the k-th recv on the destination, each side in its own order (copy of the
    step, start, its ``Seq``). NCCL runs one peer pair's point-to-point operations in the order they
    were issued, so the order pairs them; the ``Seq`` field cannot, it counts each rank's own
    point-to-point operations of the group (on the DP2 x PP4 sa_st traces rank 3's sends to rank 2
    are Seq 0-3, 8-11, ... and rank 2's recvs from rank 3 Seq 0-3, 16-19, ...: pairing equal Seq
    numbers joined a send with a recv of another microbatch, 51 ms apart, and closed a cycle).
    Unmatched kernels (a side recorded fewer) stay unpaired, with a note."""
    def order(g: int) -> tuple[int, float, float, int]:
        seq = (events[g].ref.get("args") or {}).get("Seq")
        return events[g].tile, events[g].start_us, events[g].end_us, seq if isinstance(seq, int) else 0

    sends = sorted((g for g in kernels if events[g].rank == src), key=order)
    recvs = sorted((g for g in kernels if events[g].rank == dst), key=order)
    if len(sends) != len(recvs):
        notes.append(f"{label}: {len(sends)} sends and {len(recvs)} recvs; pairing the first "
                     f"{min(len(sends), len(recvs))} in order, the rest unpaired")
    return [[s, r] for s, r in zip(sends, recvs, strict=False)]


def _p2p_peer(ev: Event, key: str) -> tuple[str, int, int, int] | None:
    """(group, source, destination, sequence) of a point-to-point kernel whose trace names them
    (``Src Rank``/``Dst Rank``, global ranks, and ``Seq``): the send on the source and the recv on
    the destination carry the same four, and are one transfer."""
    args = ev.ref.get("args") or {}
    src, dst, seq = args.get("Src Rank"), args.get("Dst Rank"), args.get("Seq")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (src, dst, seq)):
        return None
    return key, int(src), int(dst), int(seq)


def _pair_by_end(events: list[Event], kernels: list[int]) -> list[list[int]]:
    """Point-to-point peers: kernels of different ranks that ended within a few µs of each other
    in the input, at most one per rank."""
    order = sorted(kernels, key=lambda g: (events[g].end_us, events[g].rank))
    groups: list[list[int]] = []
    for g in order:
        cur = groups[-1] if groups else None
        if (cur is not None and events[g].end_us - events[cur[0]].end_us <= _SENDRECV_END_TOL_US
                and all(events[x].rank != events[g].rank for x in cur)):
            cur.append(g)
        else:
            groups.append([g])
    return groups
