"""The trace mutator on a four-stage 1F1B pipeline (issue 44): point-to-point transfers are paired
per directed channel in issue order, not by their ``Seq`` field (a per-rank counter: on the real
DP2 x PP4 sa_st traces equal Seq numbers joined a send with a recv of another microbatch and the
dependencies formed a cycle); what a recorded order contradicts is relaxed, with a note, instead of
aborting. Hand-built GPU-only Kineto traces in the shape of the converted sa_st traces (compute on
one stream, NCCL on others, no launches), with the timings of a simulated 1F1B schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.tracefault.build import build
from bench.tracefault.faults import GpuFault
from bench.tracefault.graph import TimingCycleError, acyclic_edges, topological_order
from bench.tracefault.mutate import retime
from bench.tracefault.traces import RankTrace, tile
from tests.pipeline_traces import (
    BWD_US,
    FWD_US,
    LAST_STAGE_SCALE,
    MICRO,
    STAGES,
    ops_1f1b,
    schedule,
)
from tests.pipeline_traces import pipeline_ranks as _ranks


def test_the_synthetic_pipeline_is_a_1f1bschedule() -> None:
    assert [op for op, _ in ops_1f1b(0)] == ["F", "F", "F", "F", "B", "F", "B", "F", "B", "B", "B", "B"]
    assert [op for op, _ in ops_1f1b(3)] == ["F", "B"] * MICRO
    sends = {s: [e["args"] for e in schedule()[s] if e["args"].get("Collective name") == "send"] for s in range(STAGES)}
    recvs = {s: [e["args"] for e in schedule()[s] if e["args"].get("Collective name") == "recv"] for s in range(STAGES)}
    # the sends from 2 to 3 and the recvs of 3 from 2 carry different Seq numbers (what cycled)
    assert [a["Seq"] for a in sends[2] if a["Dst Rank"] == 3] != [a["Seq"] for a in recvs[3] if a["Src Rank"] == 2]


def test_each_transfer_pairs_a_send_with_the_recv_of_the_same_microbatch_and_direction() -> None:
    jg = build(_ranks())
    p2p = [i for i in jg.instances if "->" in i.group]
    assert len(p2p) == 2 * 2 * (STAGES - 1) * MICRO  # two steps, activations forward, gradients back
    for inst in p2p:
        assert len(inst.members) == 2
        a, b = (jg.events[m].ref["args"] for m in inst.members)
        assert {a["Collective name"], b["Collective name"]} == {"send", "recv"}
        assert (a["mb"], a["step"]) == (b["mb"], b["step"])
        assert (a["Src Rank"], a["Dst Rank"]) == (b["Src Rank"], b["Dst Rank"])
    assert not [n for n in jg.notes if "relaxed" in n]


def test_identity_reproduces_the_pipeline_exactly_and_tiles_without_a_cycle() -> None:
    jg, t = retime(_ranks())  # raised TimingCycleError before (Seq pairing)
    assert np.abs(t - jg.graph.t_in_us).max() < 1e-6
    ranks = _ranks(1)
    tile(ranks, 3)
    jg3, t3 = retime(ranks)
    tile0 = np.repeat([e.tile == 0 for e in jg3.events], 2)
    assert np.abs(t3 - jg3.graph.t_in_us)[tile0].max() < 1e-6  # the recorded step, exactly
    assert not [n for n in jg3.notes if "relaxed" in n]
    assert len([i for i in jg3.instances if "->" in i.group]) == 3 * 2 * (STAGES - 1) * MICRO


def test_a_slowed_last_stage_lengthens_the_step_and_its_peers_wait() -> None:
    ranks = _ranks()
    jg0, t0 = retime(ranks)
    jg1, t1 = retime(ranks, [GpuFault("slow_gpu", (STAGES - 1,), {"factor": 1.5})])
    span0, span1 = t0.max() - t0.min(), t1.max() - t1.min()
    # the last stage's 2 x 6 x 30 us of compute on the critical path grows by half
    assert span1 - span0 > 0.5 * MICRO * (FWD_US + BWD_US) * LAST_STAGE_SCALE * 0.5
    first_bwd = next(i for i, e in enumerate(jg1.events) if e.rank == 0 and e.name == "bwd_gemm")
    assert t1[2 * first_bwd] > t0[2 * first_bwd] + 1.0  # stage 0 waits longer for its first gradient


def _deadlocked() -> list[RankTrace]:
    """Two ranks that each recorded a receive from the other before their own send, one after the
    other on one stream: a recorded order no dependency model can keep (it waits in a circle)."""
    def k(name: str, ts: float, dur: float, src: int, dst: int) -> dict[str, Any]:
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 13, "ts": ts, "dur": dur,
                "args": {"device": 0, "stream": 13, "Process Group Name": "pp", "Process Group Ranks": "[0, 1]",
                         "Src Rank": src, "Dst Rank": dst, "Seq": 0}}
    out = []
    for r in (0, 1):
        evs = [k("ncclDevKernel_SendRecv", 0.0, 10.0, 1 - r, r), k("ncclDevKernel_SendRecv", 10.0, 2.0, r, 1 - r),
               {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 12.0, "dur": 5.0,
                "args": {"device": 0, "stream": 7}}]
        doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": 2}, "traceEvents": evs}
        out.append(RankTrace(r, Path(f"rank-{r}.json"), doc, [0] * len(evs)))
    return out


def test_a_contradictory_recorded_order_is_relaxed_with_a_note_not_an_abort() -> None:
    jg, t = retime(_deadlocked())  # would raise TimingCycleError without the relaxation
    relaxed = [n for n in jg.notes if "relaxed" in n]
    assert len(relaxed) == 1 and "transfer" in relaxed[0]
    assert np.abs(t - jg.graph.t_in_us).max() < 1e-6  # identity still exact
    topological_order(jg.graph)  # the graph it keeps is acyclic
    _, t2 = retime(_deadlocked(), [GpuFault("slow_gpu", (0,), {"factor": 2.0})])
    gemm0 = next(i for i, e in enumerate(jg.events) if e.rank == 0 and e.name == "gemm")
    assert abs((t2[2 * gemm0 + 1] - t2[2 * gemm0]) - 10.0) < 1e-6  # faults still apply


def test_acyclic_edges_keeps_every_edge_of_an_acyclic_graph_and_breaks_a_cycle_at_its_latest_edge() -> None:
    from bench.tracefault.graph import EdgeList, TimingGraph
    el = EdgeList()
    el.add(0, 1, 1.0, 1)
    el.add(1, 2, 1.0, 1)
    g = TimingGraph.from_edges(np.array([0.0, 1.0, 2.0]), el)
    assert acyclic_edges(g).all()
    el.add(2, 1, 0.0, 1)  # 2 -> 1 goes back in time and closes a cycle
    g = TimingGraph.from_edges(np.array([0.0, 1.0, 2.0]), el)
    try:
        topological_order(g)
        raise AssertionError("a cycle went unnoticed")
    except TimingCycleError:
        pass
    assert acyclic_edges(g).tolist() == [True, True, False]


def _gc_rank() -> list[RankTrace]:
    """A launch-less rank (a converted trace): compute, a zero-length garbage-collection marker on
    the host, compute again, twice (one per recorded step)."""
    def k(ts: float) -> dict[str, Any]:
        return {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts, "dur": 10.0,
                "args": {"device": 0, "stream": 7}}

    def gc(ts: float) -> dict[str, Any]:
        return {"ph": "X", "cat": "python_function", "name": "gc/__init__.py(1): collect", "pid": 1, "tid": 1,
                "ts": ts, "dur": 0.0}
    evs = [k(0.0), gc(10.0), k(10.0), k(100.0), gc(110.0), k(110.0)]
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": evs}
    return [RankTrace(0, Path("rank-0.json"), doc, [0] * len(evs))]


def test_a_pause_on_a_launch_less_rank_lengthens_its_gc_and_the_gpu_work_after_it_waits() -> None:
    jg, t0 = retime(_gc_rank())
    assert np.abs(t0 - jg.graph.t_in_us).max() < 1e-6
    _, t = retime(_gc_rank(), [GpuFault("gc_pause", (0,), {"ms": 0.05, "every": 2})])
    gcs = [i for i, e in enumerate(jg.events) if "collect" in e.name]
    gemms = sorted((i for i, e in enumerate(jg.events) if e.name == "gemm"), key=lambda i: jg.events[i].start_us)
    durs = [t[2 * i + 1] - t[2 * i] for i in gcs]
    assert sorted(durs) == pytest.approx([0.0, 50.0])  # one of the two, lengthened by 50 µs
    paused = gcs[int(np.argmax(durs))]
    after = next(i for i in gemms if jg.events[i].start_us >= jg.events[paused].start_us)
    assert t[2 * after] == pytest.approx(t[2 * paused + 1])  # the next kernel starts when it ends
    _, ts = retime(_gc_rank(), [GpuFault("host_stall", (0,), {"ms": 0.02, "before": "collect"})])
    assert [ts[2 * i + 1] - ts[2 * i] for i in gcs] == pytest.approx([20.0, 20.0])  # every step's
    assert ts[2 * gemms[-1]] == pytest.approx(110.0 + 40.0)  # both stalls delay the last kernel
