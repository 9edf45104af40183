"""Hand-built GPU-only Kineto traces of a DP x PP4 1F1B pipeline (issue 44), in the shape of the
converted sa_st traces (compute on one stream, NCCL on others, no launches, process groups on the
NCCL kernels and in ``distributedInfo.pg_config``), with the timings of a simulated 1F1B schedule in
which each transfer blocks both sides: per replica, warm-up forwards, steady one-forward-one-
backward, cool-down backwards, then the embedding all-reduce between the first and the last stage
and each stage's data-parallel all-reduce. The last stage computes ``LAST_STAGE_SCALE`` times as
long (sa_st's partition imbalance). ``Seq`` numbers a rank's own point-to-point operations as the
sa_st traces do (blocks per kind and step), so a send and its recv carry different numbers."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from bench.tracefault.traces import RankTrace

COMPUTE, SEND, RECV, EMB, DP = 7, 13, 14, 15, 16
STAGES, MICRO = 4, 6
FWD_US, BWD_US, XFER_US = 10.0, 20.0, 1.0
LAST_STAGE_SCALE = 2.0  # the last stage computes twice as long (sa_st's partition imbalance)


def ops_1f1b(s: int) -> list[tuple[str, int]]:
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


def schedule() -> dict[int, list[dict[str, Any]]]:
    """Per rank: its kernels with the times a blocking-transfer 1F1B pipeline gives them."""
    ops = {s: ops_1f1b(s) for s in range(STAGES)}
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
        return transfer(peer, pos[(peer, consumed(ops[s][k]))])[1]

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


def consumed(op: tuple[str, int]) -> tuple[str, int]:
    return op  # the consumer runs the same kind of op on the same microbatch


def pipeline_ranks(recorded_steps: int = 2, dp: int = 1) -> list[RankTrace]:
    """The traces of ``dp`` replicas of the pipeline (global rank = replica x STAGES + stage) with
    ``recorded_steps`` steps one after the other (as sa_st records 32), each rank's Seq counting on
    from step to step; with ``dp`` > 1 each step ends with every stage's data-parallel all-reduce."""
    sched = schedule()
    span = max(e["ts"] + e["dur"] for evs in sched.values() for e in evs) + 3.0
    if dp > 1:
        end = max(e["ts"] + e["dur"] for evs in sched.values() for e in evs)
        for s in range(STAGES):
            last = max(e["ts"] + e["dur"] for e in sched[s])
            sched[s].append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16", "pid": 0,
                             "tid": DP, "ts": last, "dur": end + 8.0 - last,
                             "args": {"device": 0, "stream": DP, "Process Group Name": f"dp{s}",
                                      "Process Group Description": "DATA_PARALLEL_GROUP"}})
        span += 8.0
    out = []
    for d in range(dp):
        off = d * STAGES
        pp = list(range(off, off + STAGES))
        for s in range(STAGES):
            n_p2p = sum(1 for e in sched[s] if "Seq" in e["args"])
            evs = []
            for c in range(recorded_steps):
                for e in sched[s]:
                    a = dict(e["args"])
                    if "Seq" in a:
                        a.update({"Seq": a["Seq"] + c * n_p2p, "Src Rank": a["Src Rank"] + off,
                                  "Dst Rank": a["Dst Rank"] + off, "Process Group Name": f"pp{d}",
                                  "Process Group Ranks": str(pp)})
                    elif a.get("Process Group Name") == "emb":
                        a.update({"Process Group Name": f"emb{d}", "Process Group Ranks": str([off, off + STAGES - 1])})
                    elif str(a.get("Process Group Name", "")).startswith("dp"):
                        a["Process Group Ranks"] = str([s + STAGES * x for x in range(dp)])
                    a["step"] = c
                    evs.append(dict(e, ts=e["ts"] + c * span, args=a))
            evs.sort(key=lambda e: e["ts"])
            rank = off + s
            groups = [{"pg_name": f"pp{d}", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP", "backend_config": "cuda:nccl",
                       "pg_size": STAGES, "ranks": pp}]
            if s in (0, STAGES - 1):
                groups.append({"pg_name": f"emb{d}", "pg_desc": "EMBEDDING_GROUP", "backend_config": "cuda:nccl",
                               "pg_size": 2, "ranks": [off, off + STAGES - 1]})
            if dp > 1:
                groups.append({"pg_name": f"dp{s}", "pg_desc": "DATA_PARALLEL_GROUP", "backend_config": "cuda:nccl",
                               "pg_size": dp, "ranks": [s + STAGES * x for x in range(dp)]})
            doc = {"schemaVersion": 1, "traceEvents": evs,
                   "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": dp * STAGES, "pg_config": groups}}
            out.append(RankTrace(rank, Path(f"rank-{rank}.dp{d}.stage{s}.pt.trace.json"), doc, [0] * len(evs)))
    return out


def write_pipeline(directory: Path, recorded_steps: int = 2, dp: int = 1) -> list[Path]:
    """``pipeline_ranks`` written as Kineto JSON files under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for rt in pipeline_ranks(recorded_steps, dp):
        p = directory / rt.path.name
        p.write_text(json.dumps(rt.doc))
        out.append(p)
    return out
