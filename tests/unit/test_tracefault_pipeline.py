"""The trace mutator on a four-stage 1F1B pipeline (issue 44): point-to-point transfers are paired
per directed channel in issue order, not by their ``Seq`` field (a per-rank counter: on the real
DP2 x PP4 sa_st traces equal Seq numbers joined a send with a recv of another microbatch and the
dependencies formed a cycle); what a recorded order contradicts is relaxed, with a note, instead of
aborting. Hand-built GPU-only Kineto traces in the shape of the converted sa_st traces (compute on
one stream, NCCL on others, no launches), with the timings of a simulated 1F1B schedule."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from bench.tracefault.build import build
from bench.tracefault.faults import GpuFault
from bench.tracefault.graph import TimingCycleError, acyclic_edges, topological_order
from bench.tracefault.mutate import retime
from bench.tracefault.traces import RankTrace, tile

COMPUTE, SEND, RECV, EMB = 7, 13, 14, 15
STAGES, MICRO = 4, 6
FWD_US, BWD_US, XFER_US = 10.0, 20.0, 1.0
LAST_STAGE_SCALE = 2.0  # the last stage computes twice as long (sa_st's partition imbalance)


def _ops(s: int) -> list[tuple[str, int]]:
    """Stage s's 1F1B order: warm-up forwards, steady one-forward-one-backward, cool-down backwards."""
    warm = min(STAGES - s - 1, MICRO)
    ops = [("F", m) for m in range(warm)]
    f, b = warm, 0
    while b < MICRO:
        if f < MICRO:
            ops.append(("F", f))
            f += 1
        ops.append(("B", b))
        b += 1
    return ops


def _schedule() -> dict[int, list[dict[str, Any]]]:
    """Per rank: its kernels with the times a blocking-transfer 1F1B pipeline gives them."""
    ops = {s: _ops(s) for s in range(STAGES)}
    pos = {(s, op): k for s in range(STAGES) for k, op in enumerate(ops[s])}

    def producer(s: int, op: tuple[str, int]) -> tuple[int, tuple[str, int]] | None:
        kind, m = op
        if kind == "F":
            return (s - 1, ("F", m)) if s > 0 else None
        return (s + 1, ("B", m)) if s < STAGES - 1 else None

    def consumer(s: int, op: tuple[str, int]) -> int | None:
        kind, _ = op
        if kind == "F":
            return s + 1 if s < STAGES - 1 else None
        return s - 1 if s > 0 else None

    @cache
    def compute_end(s: int, k: int) -> float:
        op = ops[s][k]
        start = compute_end(s, k - 1) if k else 0.0
        if producer(s, op) is not None:
            start = max(start, transfer(s, k)[1])
        dur = (FWD_US if op[0] == "F" else BWD_US) * (LAST_STAGE_SCALE if s == STAGES - 1 else 1.0)
        return start + dur

    @cache
    def send_start(s: int, k: int) -> float:  # the send of op k's output, on the send stream
        prev = [j for j in range(k) if consumer(s, ops[s][j]) is not None]
        t = compute_end(s, k)
        if prev:
            t = max(t, send_end(s, prev[-1]))
        return t

    @cache
    def send_end(s: int, k: int) -> float:
        peer = consumer(s, ops[s][k])
        assert peer is not None
        return transfer(peer, pos[(peer, _consumed(ops[s][k]))])[1]

    @cache
    def recv_start(s: int, k: int) -> float:  # the receive of op k's input, on the receive stream
        prev = [j for j in range(k) if producer(s, ops[s][j]) is not None]
        t = compute_end(s, k - 1) if k else 0.0
        if prev:
            t = max(t, transfer(s, prev[-1])[1])
        return t

    @cache
    def transfer(s: int, k: int) -> tuple[float, float]:  # (receive start, transfer end) of op k's input
        prod = producer(s, ops[s][k])
        assert prod is not None
        ps, pop = prod
        r0 = recv_start(s, k)
        return r0, max(r0, send_start(ps, pos[(ps, pop)])) + XFER_US

    def kernel(name: str, ts: float, end: float, stream: int, **extra: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": end - ts,
                "args": {"device": 0, "stream": stream, **extra}}

    out: dict[int, list[dict[str, Any]]] = {s: [] for s in range(STAGES)}
    p2p: dict[int, list[dict[str, Any]]] = {s: [] for s in range(STAGES)}
    for s in range(STAGES):
        for k, op in enumerate(ops[s]):
            end = compute_end(s, k)
            dur = (FWD_US if op[0] == "F" else BWD_US) * (LAST_STAGE_SCALE if s == STAGES - 1 else 1.0)
            out[s].append(kernel(f"{'fwd' if op[0] == 'F' else 'bwd'}_gemm", end - dur, end, COMPUTE, mb=op[1]))
            if (prod := producer(s, op)) is not None:
                r0, r1 = transfer(s, k)
                p2p[s].append(kernel("ncclDevKernel_SendRecv", r0, r1, RECV, mb=op[1], src=prod[0], dst=s,
                                     coll="recv"))
            if (peer := consumer(s, op)) is not None:
                p2p[s].append(kernel("ncclDevKernel_SendRecv", send_start(s, k), send_end(s, k), SEND, mb=op[1],
                                     src=s, dst=peer, coll="send"))
    for s in range(STAGES):
        # Seq numbers a rank's own point-to-point operations, as the sa_st traces do: per step in
        # blocks of one per kind (recv from the next stage, send to the previous, recv from the
        # previous, send to the next), counting on from step to step; a middle stage counts four
        # blocks a step, an end stage two, so a send and its recv carry equal numbers only by chance
        kinds = [("recv", s + 1, s), ("send", s, s - 1), ("recv", s - 1, s), ("send", s, s + 1)]
        seq = 0
        for coll, src, dst in kinds:
            block = sorted((e for e in p2p[s] if (e["args"].get("coll"), e["args"].get("src"), e["args"].get("dst")) == (coll, src, dst)),
                           key=lambda e: e["ts"])
            for e in block:
                a = e["args"]
                a.update({"Collective name": a.pop("coll"), "Process Group Name": "pp",
                          "Process Group Ranks": "[0, 1, 2, 3]", "Src Rank": a.pop("src"), "Dst Rank": a.pop("dst"),
                          "Seq": seq})
                seq += 1
                out[s].append(e)
    # the embedding all-reduce between the first and the last stage, at the end of the step
    emb_start = {s: max(e["ts"] + e["dur"] for e in out[s]) for s in (0, STAGES - 1)}
    emb_end = max(emb_start.values()) + 5.0
    for s, t in emb_start.items():
        out[s].append(kernel("ncclDevKernel_AllReduce_Sum_f32", t, emb_end, EMB, **{
            "Process Group Name": "emb", "Process Group Ranks": f"[0, {STAGES - 1}]"}))
    return out


def _consumed(op: tuple[str, int]) -> tuple[str, int]:
    return op  # the consumer runs the same kind of op on the same microbatch


def _ranks(recorded_steps: int = 2) -> list[RankTrace]:
    """The pipeline's traces with ``recorded_steps`` steps one after the other (as sa_st records
    32), each rank's Seq counting on from step to step."""
    sched = _schedule()
    span = max(e["ts"] + e["dur"] for evs in sched.values() for e in evs) + 3.0
    out = []
    for s in range(STAGES):
        n_p2p = sum(1 for e in sched[s] if "Seq" in e["args"])
        evs = []
        for c in range(recorded_steps):
            for e in sched[s]:
                n = dict(e, ts=e["ts"] + c * span, args=dict(e["args"]))
                if "Seq" in n["args"]:
                    n["args"]["Seq"] += c * n_p2p
                n["args"]["step"] = c
                evs.append(n)
        evs.sort(key=lambda e: e["ts"])
        doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": s, "world_size": STAGES},
               "traceEvents": evs}
        out.append(RankTrace(s, Path(f"rank-{s}.json"), doc, [0] * len(evs)))
    return out


def test_the_synthetic_pipeline_is_a_1f1b_schedule() -> None:
    assert [op for op, _ in _ops(0)] == ["F", "F", "F", "F", "B", "F", "B", "F", "B", "B", "B", "B"]
    assert [op for op, _ in _ops(3)] == ["F", "B"] * MICRO
    sends = {s: [e["args"] for e in _schedule()[s] if e["args"].get("Collective name") == "send"] for s in range(STAGES)}
    recvs = {s: [e["args"] for e in _schedule()[s] if e["args"].get("Collective name") == "recv"] for s in range(STAGES)}
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
