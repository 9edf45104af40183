"""Mutate a trace set: read, tile, build the timing graph, apply faults, re-time, write."""

from __future__ import annotations

import bisect
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.tracefault.build import JobGraph, build
from bench.tracefault.faults import GpuFault, apply_faults
from bench.tracefault.graph import solve, topological_order
from bench.tracefault.traces import RankTrace, is_timed, read_trace_dir, tile, write_trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MutationResult:
    out_dir: Path | None
    ranks: int
    events: int  # modelled events (all copies)
    identity_within_1us: float  # recorded step: share of events the unmutated re-timing puts within 1 µs of the input
    unmoved_within_1us: float  # share of events the faults moved by <= 1 µs against the unmutated re-timing
    job_in_us: float  # the job's span (first start to last end over all ranks), unmutated re-timing
    job_out_us: float  # the same, output
    step_in_us: float  # the job's step time, unmutated (see step_time_us)
    step_out_us: float  # the same, output
    build_s: float
    solve_s: float
    notes: tuple[str, ...] = ()

    @property
    def slowdown(self) -> float:
        """Step time out / in - 1: the fault's cost to the job."""
        return self.step_out_us / self.step_in_us - 1.0 if self.step_in_us > 0 else 0.0


def step_time_us(jg: JobGraph, t: np.ndarray) -> float:
    """The job's step time: with several copies of the step, the mean spacing of the end of each
    copy's last collective (where every rank meets), from copy 1 on when there are three or more;
    with one copy, or no collectives, the job span."""
    last: dict[int, float] = {}
    for inst in jg.instances:
        c = jg.events[inst.members[0]].tile
        end = max(t[2 * m + 1] for m in inst.members)
        last[c] = max(last.get(c, -np.inf), end)
    if len(last) >= 2:
        tiles = sorted(last)
        if len(tiles) >= 3:  # copy 0 is the recorded step with its start-up offsets; measure from copy 1
            tiles = tiles[1:]
        return (last[tiles[-1]] - last[tiles[0]]) / (tiles[-1] - tiles[0])
    return float(t.max() - t.min())


def retime(ranks: list[RankTrace], faults: list[GpuFault] | tuple[GpuFault, ...] = (), seed: int = 0
           ) -> tuple[JobGraph, np.ndarray]:
    """The job graph and every node's output time (relative µs). ``ranks`` is not modified."""
    jg = build(ranks)
    w = apply_faults(jg, faults, seed)
    t = solve(jg.graph, w, topological_order(jg.graph), (jg.residual_us, jg.has_in))
    return jg, t


def _num(base: Any, rel: float, as_int: bool) -> int | float:
    x = base + rel
    if as_int and abs(rel - round(rel)) < 1e-6:
        return int(round(x))
    return round(float(x), 3)


def apply_times(ranks: list[RankTrace], jg: JobGraph, t_out: np.ndarray) -> None:
    """Write the output times into the rank documents (in place): modelled events from the graph,
    flows, GPU annotations, instants and the profiler span warped by the nearest earlier time point
    of their lane (or of the rank)."""
    origin = jg.origin_us
    as_int = all(isinstance(e.ref["ts"], int) and isinstance(e.ref.get("dur", 0), int) for e in jg.events[:2000])
    t_in = jg.graph.t_in_us
    lane_pts: dict[tuple[int, Any, Any], list[tuple[float, float]]] = defaultdict(list)
    rank_pts: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for i, ev in enumerate(jg.events):
        for node in (2 * i, 2 * i + 1):
            lane_pts[(ev.rank, ev.ref.get("pid"), ev.ref.get("tid"))].append((t_in[node], t_out[node]))
            rank_pts[ev.rank].append((t_in[node], t_out[node]))
    for d in (lane_pts, rank_pts):
        for v in d.values():
            v.sort()
    lane_keys = {k: [p[0] for p in v] for k, v in lane_pts.items()}
    rank_keys = {k: [p[0] for p in v] for k, v in rank_pts.items()}

    def warp(rank: int, pid: Any, tid: Any, rel: float) -> float:
        pts, keys = lane_pts.get((rank, pid, tid)), lane_keys.get((rank, pid, tid))
        if not pts:
            pts, keys = rank_pts[rank], rank_keys[rank]
        k = bisect.bisect_right(keys, rel + 1e-9)
        a, b = pts[max(k - 1, 0)]
        return rel + (b - a)

    for i, ev in enumerate(jg.events):
        s, e = t_out[2 * i], t_out[2 * i + 1]
        ev.ref["ts"] = _num(origin, s, as_int)
        if "dur" in ev.ref:
            ev.ref["dur"] = _num(0, e - s, as_int)
    for rt in ranks:
        if rt.rank not in rank_pts:
            continue
        lo = min(p[1] for p in rank_pts[rt.rank])
        hi = max(p[1] for p in rank_pts[rt.rank])
        modelled = {id(ev.ref) for ev in jg.events if ev.rank == rt.rank}
        for e in rt.events:
            if id(e) in modelled or not isinstance(e.get("ts"), (int, float)) or e.get("ph") == "M":
                continue
            rel = float(e["ts"] - origin)
            if e.get("cat") == "Trace" or e.get("pid") == "Spans":  # the profiler's span covers every event
                s = min(lo, warp(rt.rank, None, None, rel))
                end = max(hi, warp(rt.rank, None, None, rel + float(e.get("dur", 0))))
                e["ts"] = _num(origin, s, as_int)
                e["dur"] = _num(0, end - s, as_int)
            elif e.get("ph") == "i" and "End" in str(e.get("name", "")):
                e["ts"] = _num(origin, max(hi, warp(rt.rank, None, None, rel)), as_int)
            elif is_timed(e):
                s = warp(rt.rank, e.get("pid"), e.get("tid"), rel)
                end = warp(rt.rank, e.get("pid"), e.get("tid"), rel + float(e.get("dur", 0)))
                e["ts"] = _num(origin, s, as_int)
                e["dur"] = _num(0, max(0.0, end - s), as_int)
            else:
                e["ts"] = _num(origin, warp(rt.rank, e.get("pid"), e.get("tid"), rel), as_int)


def mutate_dir(in_dir: Path, out_dir: Path | None, faults: list[GpuFault] | tuple[GpuFault, ...] = (),
               steps: int = 1, seed: int = 0, hardware: bool = True, ranks_per_host: int = 0) -> MutationResult:
    """Read DIR, tile ``steps`` times, apply ``faults``, re-time and (unless out_dir is None) write,
    with (``hardware``) each rank's hardware series beside its trace (bench/tracefault/hwseries.py;
    ``ranks_per_host`` 0: one host)."""
    t0 = time.monotonic()
    ranks = read_trace_dir(in_dir)
    tile(ranks, steps)
    jg = build(ranks)
    w = apply_faults(jg, faults, seed, ranks_per_host)
    t1 = time.monotonic()
    order = topological_order(jg.graph)
    resid = (jg.residual_us, jg.has_in)
    t_out = solve(jg.graph, w, order, resid)
    t2 = time.monotonic()
    # the unmutated re-timing: the recorded step itself, and its copies in the model's steady state
    t_base = t_out if not faults else solve(jg.graph, jg.graph.w0_us, order, resid)
    n = len(jg.events)
    tile0 = np.fromiter((e.tile == 0 for e in jg.events), dtype=bool, count=n)
    d_in = np.abs(t_base - jg.graph.t_in_us).reshape(n, 2).max(axis=1)
    d_out = np.abs(t_out - t_base).reshape(n, 2).max(axis=1)
    res = MutationResult(out_dir, len(ranks), n, float((d_in[tile0] <= 1.0).mean()) if n else 1.0,
                         float((d_out <= 1.0).mean()) if n else 1.0,
                         float(t_base.max() - t_base.min()), float(t_out.max() - t_out.min()),
                         step_time_us(jg, t_base), step_time_us(jg, t_out), t1 - t0, t2 - t1, tuple(jg.notes))
    for note in jg.notes:
        log.warning("%s", note)
    if out_dir is not None:
        apply_times(ranks, jg, t_out)
        for rt in ranks:
            write_trace(rt, out_dir)
        if hardware:
            from bench.tracefault.hwseries import write_samples

            write_samples(ranks, jg, faults, out_dir, ranks_per_host, seed)
    return res
