"""The trace mutator on ranks whose traces have no launches (issue 28): the device's cross-stream
order as recorded is kept, so a slowed compute stream delays the communication that followed it in
the input, and what overlapped in the input stays free to overlap. Hand-built GPU-only Kineto traces
(the converted sa_se traces have this shape: compute on one stream, NCCL on another, no runtime
calls or flows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.tracefault.faults import GpuFault
from bench.tracefault.mutate import retime
from bench.tracefault.traces import RankTrace

COMPUTE, COMM = 7, 13
SR = "ncclDevKernel_SendRecv"


def _kernel(name: str, ts: float, dur: float, stream: int, corr: int | None = None, **extra: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"device": 0, "stream": stream, **extra}
    if corr is not None:
        args["correlation"] = corr
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}


def _p2p(ts: float, dur: float, src: int, dst: int) -> dict[str, Any]:
    return _kernel(SR, ts, dur, COMM, **{"Process Group Name": "pp", "Process Group Ranks": "[0, 1]",
                                         "Src Rank": src, "Dst Rank": dst, "Seq": 0})


def _rank(rank: int, events: list[dict[str, Any]]) -> RankTrace:
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
           "traceEvents": events}
    return RankTrace(rank, Path(f"rank{rank}.json"), doc, [0] * len(events))


def _times(ranks: list[RankTrace], factor: float) -> dict[tuple[int, str], tuple[float, float]]:
    faults = [GpuFault("slow_gpu", (0,), {"factor": factor})] if factor != 1.0 else []
    jg, t = retime(ranks, faults)
    return {(e.rank, e.name): (t[2 * i] + jg.origin_us, t[2 * i + 1] + jg.origin_us) for i, e in enumerate(jg.events)}


def _pipeline(send_at_us: float) -> list[RankTrace]:
    """Rank 0 computes 0-100 on its compute stream and sends to rank 1 at ``send_at_us`` on its
    communication stream (10 µs transfer); rank 1 receives from 0 and then computes on."""
    r0 = _rank(0, [_kernel("gemm", 0, 100, COMPUTE), _p2p(send_at_us, 10, 0, 1)])
    end = send_at_us + 10
    r1 = _rank(1, [_p2p(0, end, 0, 1), _kernel("gemm_next", end, 40, COMPUTE)])
    return [r0, r1]


def test_a_send_that_followed_the_compute_waits_for_it_and_the_receiver_computes_later() -> None:
    ranks = _pipeline(100.0)
    assert _times(ranks, 1.0) == {(0, "gemm"): (0, 100), (0, SR): (100, 110),
                                  (1, SR): (0, 110), (1, "gemm_next"): (110, 150)}  # the input
    t = _times(ranks, 2.0)
    assert t[(0, "gemm")] == (0, 200)
    assert t[(0, SR)] == (200, 210)  # the send follows the slowed compute
    assert t[(1, SR)] == (0, 210)  # the receiver waits for it
    assert t[(1, "gemm_next")] == (210, 250)  # and its compute follows the receive (the other direction)


def test_near_the_edge_a_slight_slowdown_moves_the_send_by_exactly_the_excess() -> None:
    t = _times(_pipeline(100.0), 1.01)
    assert abs(t[(0, SR)][0] - 101.0) < 1e-9 and abs(t[(1, "gemm_next")][0] - 111.0) < 1e-9


def test_a_send_that_overlapped_the_compute_in_the_input_does_not_move() -> None:
    ranks = _pipeline(50.0)  # the send started while the compute still ran: no order between them
    assert _times(ranks, 1.0)[(0, SR)] == (50, 60)
    t = _times(ranks, 2.0)
    assert t[(0, "gemm")] == (0, 200)
    assert t[(0, SR)] == (50, 60)
    assert t[(1, SR)] == (0, 60) and t[(1, "gemm_next")] == (60, 100)


def test_a_gap_in_the_input_is_kept_as_slack_of_the_same_size() -> None:
    # the send started 30 µs after the compute ended: the gap (residual) stays, measured from the new end
    t = _times(_pipeline(130.0), 2.0)
    assert t[(0, SR)] == (230, 240)


def test_a_rank_with_launches_keeps_only_what_its_launches_say() -> None:
    # the same order in time, but the kernel on the other stream was launched on its own at 101:
    # nothing makes it wait for the compute stream (the launch-less rule does not apply)
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100, "ts": 95,
               "dur": 3, "args": {"correlation": 1}},
              _kernel("gemm", 100, 10, COMPUTE, corr=1),
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100, "ts": 101,
               "dur": 3, "args": {"correlation": 2}},
              _kernel("other", 112, 5, COMM, corr=2)]
    r = RankTrace(0, Path("rank0.json"), {"schemaVersion": 1, "traceEvents": events}, [0] * len(events))
    jg, t = retime([r], [GpuFault("slow_gpu", (0,), {"factor": 3.0})])
    got = {e.name: (t[2 * i] + jg.origin_us, t[2 * i + 1] + jg.origin_us) for i, e in enumerate(jg.events)}
    assert got["gemm"] == (100, 130)
    assert got["other"] == (112, 127)  # its own duration 3x, its start where it was


def test_two_instant_events_on_two_streams_order_one_way_only() -> None:
    # zero-length events at the same instant on both streams: each "ended before the other started";
    # only the earlier in (start, end, order) may wait, or the graph would hold a cycle
    r = _rank(0, [_kernel("gemm", 0, 0, COMPUTE), _kernel("ncclDevKernel_AllReduce", 0, 0, COMM,
                                                             **{"Process Group Ranks": "[0]"}),
                  _kernel("gemm2", 0, 5, COMPUTE)])
    t = _times([r], 2.0)
    assert t[(0, "gemm2")] == (0, 10)


# --- a batched send/recv: two kernels of one stream that ran together ---------------------------------

def _pp(ts: float, dur: float, src: int, dst: int) -> dict[str, Any]:
    return _kernel(SR, ts, dur, COMM, **{"Process Group Name": f"pp{min(src, dst)}{max(src, dst)}",
                                         "Process Group Ranks": str(sorted((src, dst))),
                                         "Src Rank": src, "Dst Rank": dst, "Seq": 0})


def _rank3(rank: int, events: list[dict[str, Any]]) -> RankTrace:
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 3},
           "traceEvents": events}
    return RankTrace(rank, Path(f"rank{rank}.json"), doc, [0] * len(events))


def _batched(recv_at_us: float) -> list[RankTrace]:
    """Rank 0 sends to rank 1 at 100 and receives from rank 2 at ``recv_at_us`` on one stream (at 100:
    one batched send/recv, written as two kernels). Rank 1 computes until 100, then receives; rank 2
    sends from 100 until rank 0's recv ends."""
    recv_end = recv_at_us + 8
    r0 = _rank3(0, [_pp(100, 8, 0, 1), _pp(recv_at_us, 8, 2, 0)])
    r1 = _rank3(1, [_kernel("gemm", 0, 100, COMPUTE), _pp(100, 8, 0, 1)])
    r2 = _rank3(2, [_pp(100, recv_end - 100, 2, 0)])
    return [r0, r1, r2]


def _by_rank_dst(ranks: list[RankTrace], factor: float) -> dict[tuple[int, int], tuple[float, float]]:
    jg, t = retime(ranks, [GpuFault("slow_gpu", (1,), {"factor": factor})])
    return {(e.rank, int(e.ref["args"]["Dst Rank"])): (t[2 * i] + jg.origin_us, t[2 * i + 1] + jg.origin_us)
            for i, e in enumerate(jg.events) if e.name == SR}


def test_the_halves_of_a_batched_send_recv_do_not_wait_for_each_other() -> None:
    t = _by_rank_dst(_batched(100.0), 2.0)  # rank 1 reaches its recv at 200
    assert t[(0, 1)] == (100, 208)  # rank 0's send waits for rank 1
    assert t[(0, 0)] == (100, 108)  # its recv from rank 2, launched with it, does not


def test_a_recv_queued_behind_the_send_still_waits_for_it() -> None:
    t = _by_rank_dst(_batched(108.0), 2.0)  # the twin: the recv started when the send ended
    assert t[(0, 1)] == (100, 208)
    assert t[(0, 0)] == (208, 216)


def test_both_halves_of_a_batched_send_recv_wait_for_the_compute_before_them() -> None:
    # rank 0 computes until 100, then sends to 1 and receives from 2 in one batch; its peers wait
    ranks = [_rank3(0, [_kernel("gemm", 0, 100, COMPUTE), _pp(100, 8, 0, 1), _pp(100, 8, 2, 0)]),
             _rank3(1, [_pp(0, 108, 0, 1)]), _rank3(2, [_pp(0, 108, 2, 0)])]
    jg, t = retime(ranks, [GpuFault("slow_gpu", (0,), {"factor": 2.0})])
    got = {(e.rank, int(e.ref["args"]["Src Rank"])): (t[2 * i] + jg.origin_us, t[2 * i + 1] + jg.origin_us)
           for i, e in enumerate(jg.events) if e.name == SR}
    assert got[(0, 0)] == (200, 208) and got[(0, 2)] == (200, 208)  # neither half starts before the compute ends
    assert got[(1, 0)][1] == 208 and got[(2, 2)][1] == 208
