"""The hardware series the agent would have recorded beside each rank's mutated trace.

For each rank the mutator writes ``<trace name>.samples.npz`` (``perftracker.cli.analyze_rank.samples_beside``),
a ``SampleSet`` in the agent's own format, on the trace's time base (ns = trace µs × 1000), one
sample per ``PERIOD_NS`` over the rank's span:

- ``sm``: the share of the period a compute kernel ran (NVML/GPM-like utilization).
- ``sm_clock``: SM clock over its maximum (``MAX_MHZ``): 0.97-1.0 (seeded jitter), or a ``throttle``
  fault's ``clock``; ``throttle_thermal`` / ``throttle_power`` / ``throttle_sw`` 1 while throttled.
- the link of the rank's collectives (``ranks_per_host`` decides, per instance): ``nvlink`` inside a
  host, ``nic`` between hosts: ``LINK_UTIL`` of the link while a collective kernel runs, divided by
  the instance's ``slow_link`` factor (every member of a slowed instance moves its bytes that much
  slower), during the transfer only: the last (transfer time × factor) of each collective kernel, the
  time before it a member waits for its peers with the link idle. With several hosts also ``ib_xmit_wait``: a slow-link rank's own port waits
  1 - 1/factor of its slowed collectives' time, every port ``IDLE_WAIT`` (seeded jitter);
  ``ib_link_errors`` 0.
- ``pcie``: ``PCIE_UTIL`` while a copy runs, divided by a ``slow_memcpy`` factor.

A model, like the re-timing: the levels are stated, not measured on a GPU (no GPU here).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from bench.tracefault.build import JobGraph
from bench.tracefault.faults import GpuFault, link_factors
from bench.tracefault.traces import RankTrace
from perftracker.model.hardware import (
    IB_LINK_ERRORS,
    IB_XMIT_WAIT,
    SM_CLOCK,
    THROTTLE_POWER,
    THROTTLE_SW,
    THROTTLE_THERMAL,
    clock_source,
)
from perftracker.model.raw_window import SampleSet, UtilSeries

PERIOD_NS = 100_000  # 10 kHz, nsys's GPU metrics rate
MAX_MHZ = 1530.0  # a V100's maximum SM clock (the dlrm traces ran volta kernels)
LINK_UTIL = 0.6
PCIE_UTIL = 0.4
IDLE_WAIT = 0.004
_REASON_SERIES = {"thermal": THROTTLE_THERMAL, "power": THROTTLE_POWER, "sw": THROTTLE_SW}


def coverage(start_ns: np.ndarray, end_ns: np.ndarray, weight: np.ndarray, t0_ns: int, n: int,
             period_ns: int = PERIOD_NS) -> np.ndarray:
    """Per period [t0 + k·P, t0 + (k+1)·P): Σ weight × overlap / P, clipped to [0, 1]."""
    out = np.zeros(n + 1)
    for s, e, w in zip(np.asarray(start_ns, np.float64), np.asarray(end_ns, np.float64), np.asarray(weight), strict=True):
        if e <= s:
            continue
        a, b = (s - t0_ns) / period_ns, (e - t0_ns) / period_ns
        ka, kb = int(np.floor(a)), int(np.floor(b))
        ka, kb = max(ka, 0), min(kb, n)
        if ka == kb:
            out[ka] += w * (b - a)
            continue
        out[ka] += w * (ka + 1 - a)
        out[ka + 1:kb] += w
        out[kb] += w * (b - kb)
    return np.clip(out[:n], 0.0, 1.0)


def _link(start_ns: np.ndarray, end_ns: np.ndarray, factor: np.ndarray, t0_ns: int, n: int) -> np.ndarray:
    """A link's utilization: ``LINK_UTIL`` over the share of each period in which any collective
    runs (concurrent collectives share the link, they do not add up), divided by the largest
    ``slow_link`` factor of those that run in it."""
    busy = coverage(start_ns, end_ns, np.ones(len(start_ns)), t0_ns, n)
    slow = factor > 1.0
    worst = np.ones(n)
    for f in np.unique(factor[slow]):
        sel = factor == f
        hit = coverage(start_ns[sel], end_ns[sel], np.ones(int(sel.sum())), t0_ns, n) > 0
        worst[hit] = np.maximum(worst[hit], f)
    return LINK_UTIL * busy / worst


def _series(name: str, t_ns: np.ndarray, v: np.ndarray, source: str = "tracefault") -> UtilSeries:
    return UtilSeries(name, t_ns, np.clip(v, 0, 1).astype(np.float32), PERIOD_NS, source)


def rank_samples(rt: RankTrace, jg: JobGraph, faults: Iterable[GpuFault], ranks_per_host: int, world: int,
                 seed: int, instance_factor: dict[int, float], spans: dict[int, bool] | None = None,
                 transfer_us: dict[int, float] | None = None) -> SampleSet:
    """``spans``: id(trace event) -> whether its collective instance spans hosts (None: every
    collective does when the job has several hosts)."""
    """One rank's SampleSet from its re-timed document (``apply_times`` already ran)."""
    evs = [e for e in rt.events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))
           and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not evs:
        return SampleSet()
    start = np.array([float(e["ts"]) * 1000 for e in evs])
    end = start + np.array([float(e.get("dur", 0)) * 1000 for e in evs])
    nccl = np.array(["nccl" in str(e.get("name", "")).lower() for e in evs])
    copy = np.array([e.get("cat") == "gpu_memcpy" for e in evs])
    compute = ~nccl & ~copy & np.array([e.get("cat") == "kernel" for e in evs])
    t0 = int(np.floor(start.min() / PERIOD_NS) * PERIOD_NS) - PERIOD_NS
    n = int(np.ceil((end.max() - t0) / PERIOD_NS)) + 2
    t = t0 + PERIOD_NS * (np.arange(n, dtype=np.int64) + 1)  # value[i] covers the period ending at t[i]
    rng = np.random.default_rng([seed, rt.rank])
    mine = [f for f in faults if rt.rank in f.ranks]
    link_factor = np.array([instance_factor.get(id(e), 1.0) for e in evs])
    own_slow = max((float(f.params["factor"]) for f in mine if f.kind == "slow_link"), default=1.0)
    memcpy_factor = max((float(f.params["factor"]) for f in mine if f.kind == "slow_memcpy"), default=1.0)
    throttle = next((f for f in mine if f.kind == "throttle"), None)

    out: dict[str, UtilSeries] = {}
    out["sm"] = _series("sm", t, coverage(start[compute], end[compute], np.ones(compute.sum()), t0, n))
    clock = (float(throttle.params["clock"]) if throttle else 1.0) - rng.uniform(0.0, 0.03, n)
    out[SM_CLOCK] = _series(SM_CLOCK, t, clock, clock_source("tracefault", MAX_MHZ))
    for reason, name in _REASON_SERIES.items():
        held = throttle is not None and throttle.params["reason"] == reason
        out[name] = _series(name, t, np.full(n, 1.0 if held else 0.0))
    out["pcie"] = _series("pcie", t, coverage(start[copy], end[copy], np.full(copy.sum(), PCIE_UTIL / memcpy_factor),
                                              t0, n))
    lws = ranks_per_host if ranks_per_host > 0 else world
    between_hosts = lws < world
    remote = nccl & np.array([between_hosts and (spans is None or spans.get(id(e), True)) for e in evs])
    # the link carries data only in the transfer at the end of a collective (its unmutated transfer
    # time x the slow-link factor); a member that waits for a late peer waits with the link idle
    xfer = np.array([(transfer_us or {}).get(id(e), np.inf) * 1000 for e in evs]) * link_factor
    lstart = np.maximum(start, end - xfer)
    local = nccl & ~remote
    out["nvlink"] = _series("nvlink", t, _link(lstart[local], end[local], link_factor[local], t0, n))
    if between_hosts:
        out["nic"] = _series("nic", t, _link(lstart[remote], end[remote], link_factor[remote], t0, n))
        stalled = (1.0 - 1.0 / link_factor[remote]) * (own_slow > 1.0)  # only the slow rank's own port waits
        wait = IDLE_WAIT * rng.uniform(0.5, 1.5, n) + coverage(lstart[remote], end[remote], stalled, t0, n)
        out[IB_XMIT_WAIT] = _series(IB_XMIT_WAIT, t, wait, "tracefault mlx5_0/1")
        out[IB_LINK_ERRORS] = _series(IB_LINK_ERRORS, t, np.zeros(n))
    return SampleSet(series=out)


def instance_factors(jg: JobGraph, faults: Iterable[GpuFault], ranks_per_host: int = 0) -> dict[int, float]:
    """id(trace event) -> its collective instance's slow_link factor, for the slowed instances."""
    link = link_factors(jg, list(faults), ranks_per_host)
    out: dict[int, float] = {}
    for i, inst in enumerate(jg.instances):
        if link[i] != 1.0:
            for m in inst.members:
                out[id(jg.events[m].ref)] = float(link[i])
    return out


def write_samples(ranks: list[RankTrace], jg: JobGraph, faults: Iterable[GpuFault], out_dir: Path,
                  ranks_per_host: int, seed: int) -> list[Path]:
    """Write every rank's SampleSet beside its trace in ``out_dir``."""
    from perftracker.cli.analyze_rank import samples_beside

    faults = list(faults)
    factors = instance_factors(jg, faults, ranks_per_host)
    world = len(ranks)
    spans: dict[int, bool] = {}
    transfer: dict[int, float] = {}
    for inst in jg.instances:
        across = ranks_per_host > 0 and len({jg.events[m].rank // ranks_per_host for m in inst.members}) > 1
        for m in inst.members:
            spans[id(jg.events[m].ref)] = across
            transfer[id(jg.events[m].ref)] = inst.transfer_us
    paths = []
    for rt in ranks:
        ss = rank_samples(rt, jg, faults, ranks_per_host, world, seed, factors, spans if ranks_per_host > 0 else None,
                          transfer)
        if ss.series:
            paths.append(ss.save(samples_beside(out_dir / rt.path.name)))
    return paths
