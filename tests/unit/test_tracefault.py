"""The trace mutator (bench/tracefault) and the GPU fault bench (bench/gpu_faults.py).

Unit tests of the re-timing rules on tiny hand-built Kineto traces (each rule: a case where the
delay must propagate and one where it must not) and the identity check on the real dlrm traces
(two scenarios of bench/gpu_scenarios end to end: tests/system/test_gpu_faults_quick.py).
The dlrm traces are real V100 recordings (the conftest's dlrm_dir); the hand-built ones are in
Kineto's format only.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench.tracefault.faults import GpuFault
from bench.tracefault.mutate import mutate_dir, retime
from bench.tracefault.traces import RankTrace, read_trace_dir, tile
from perftracker.errors import ConfigError

PID, TID = 100, 100


def _kernel(name: str, ts: float, dur: float, corr: int | None = None, stream: int = 7, device: int = 0) -> dict[str, Any]:
    args: dict[str, Any] = {"device": device, "stream": stream}
    if corr is not None:
        args["correlation"] = corr
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur, "args": args}


def _host(cat: str, name: str, ts: float, dur: float, corr: int | None = None, tid: int = TID) -> dict[str, Any]:
    args = {"correlation": corr} if corr is not None else {}
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _rank(rank: int, events: list[dict[str, Any]], world: int = 1) -> RankTrace:
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
           "traceEvents": events}
    return RankTrace(rank, Path(f"rank{rank}.json"), doc, [0] * len(events))


def _times(ranks: list[RankTrace], faults: list[GpuFault]) -> dict[tuple[int, str], tuple[float, float]]:
    jg, t = retime(ranks, faults)
    return {(e.rank, e.name): (t[2 * i] + jg.origin_us, t[2 * i + 1] + jg.origin_us) for i, e in enumerate(jg.events)}


def slow(rank: int, factor: float = 2.0) -> GpuFault:
    return GpuFault("slow_gpu", (rank,), {"factor": factor})


# --- stream order -------------------------------------------------------------------------------

def test_stream_order_a_longer_kernel_pushes_the_next_one_queued_behind_it() -> None:
    # K2 was queued behind K1 (launched long before K1 ended, started 2 µs after it)
    r = _rank(0, [_kernel("K1", 100, 10), _kernel("K2", 112, 8)])
    t = _times([r], [slow(0, 2.0)])
    assert t[(0, "K1")] == (100, 120)
    assert t[(0, "K2")] == (122, 138)  # 2 µs gap kept, its own duration scaled too
    assert _times([r], []) == {(0, "K1"): (100, 110), (0, "K2"): (112, 120)}


def test_stream_order_slack_absorbs_a_delay_and_other_streams_do_not_wait() -> None:
    # K2 starts 20 µs after K1 ended because of its launch; K3 runs on another stream
    events = [_host("cuda_runtime", "cudaLaunchKernel", 95, 3, corr=1), _kernel("K1", 100, 10, corr=1),
              _host("cuda_runtime", "cudaLaunchKernel", 125, 3, corr=2), _kernel("K2", 130, 5, corr=2),
              _host("cuda_runtime", "cudaLaunchKernel", 101, 3, corr=3), _kernel("K3", 106, 5, corr=3, stream=8)]
    t = _times([_rank(0, events)], [GpuFault("slow_gpu", (0,), {"factor": 1.5})])
    assert t[(0, "K1")] == (100, 115)
    assert t[(0, "K2")] == (130, 135.0 + 2.5)  # slack of 20 µs absorbed the 5 µs; only its own duration grows
    assert t[(0, "K3")][0] == 106


# --- launch flows -------------------------------------------------------------------------------

def _launch_trace() -> RankTrace:
    return _rank(0, [
        _host("cpu_op", "aten::zeros", 0, 5),
        _host("cpu_op", "aten::add", 5, 10),
        _host("cuda_runtime", "cudaLaunchKernel", 7, 4, corr=11),
        _kernel("add_kernel", 20, 3, corr=11),
        _host("cpu_op", "aten::mul", 20, 10),
        _host("cuda_runtime", "cudaLaunchKernel", 22, 4, corr=12),
        _kernel("mul_kernel", 30, 3, corr=12),
    ])


def test_launch_a_host_stall_before_the_launching_op_delays_its_kernel() -> None:
    t = _times([_launch_trace()], [GpuFault("host_stall", (0,), {"ms": 1.0, "before": "aten::mul"})])
    assert t[(0, "aten::mul")][0] == 1020
    assert t[(0, "mul_kernel")] == (1030, 1033)  # starts no earlier than its launch, same latency


def test_launch_work_launched_before_the_stall_is_not_delayed() -> None:
    t = _times([_launch_trace()], [GpuFault("host_stall", (0,), {"ms": 1.0, "before": "aten::mul"})])
    assert t[(0, "add_kernel")] == (20, 23)
    assert t[(0, "aten::add")] == (5, 15)


# --- synchronizing calls ------------------------------------------------------------------------

def _sync_trace(sync_at: float) -> RankTrace:
    return _rank(0, [
        _host("cuda_runtime", "cudaLaunchKernel", 0, 5, corr=1),
        _kernel("gemm", 10, 100, corr=1),
        _host("cuda_runtime", "cudaStreamSynchronize", sync_at, max(2.0, 112 - sync_at)),
        _host("cpu_op", "aten::after", max(sync_at + 2.0, 112), 10),
    ])


def test_sync_call_waits_for_the_slowed_kernel_and_the_host_follows() -> None:
    t = _times([_sync_trace(20)], [slow(0, 2.0)])  # the sync waited from 20 to 112 (kernel end 110)
    assert t[(0, "gemm")] == (10, 210)
    assert t[(0, "cudaStreamSynchronize")] == (20, 212)  # ends its 2 µs tail after the GPU work
    assert t[(0, "aten::after")] == (212, 222)


def test_sync_call_whose_work_ended_long_before_does_not_move() -> None:
    r = _rank(0, [
        _host("cuda_runtime", "cudaLaunchKernel", 0, 5, corr=1),
        _kernel("gemm", 10, 100, corr=1),
        _host("cpu_op", "aten::busy", 6, 494),
        _host("cuda_runtime", "cudaStreamSynchronize", 500, 3),
        _host("cpu_op", "aten::after", 503, 10),
    ])
    t = _times([r], [slow(0, 2.0)])  # the kernel now ends at 210, still before the sync at 500
    assert t[(0, "cudaStreamSynchronize")] == (500, 503)
    assert t[(0, "aten::after")] == (503, 513)


# --- collective instances -----------------------------------------------------------------------

def _allreduce_pair(late_compute_us: float) -> list[RankTrace]:
    """Rank 0 computes, then joins an all-reduce; rank 1 arrives first and waits (GPU-only traces)."""
    r0 = _rank(0, [_kernel("gemm", 0, late_compute_us), _kernel("ncclKernel_AllReduce_RING_LL_Sum_float", late_compute_us, 20)], 2)
    r1 = _rank(1, [_kernel("gemm", 0, 10), _kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 10, late_compute_us + 10)], 2)
    return [r0, r1]


def test_collective_members_end_at_latest_start_plus_transfer_and_the_waiting_peer_follows() -> None:
    ranks = _allreduce_pair(100.0)  # rank 0 arrives at 100, transfer 20 µs: both end at 120
    base = _times(ranks, [])
    assert base[(0, "ncclKernel_AllReduce_RING_LL_Sum_float")] == (100, 120)
    assert base[(1, "ncclKernel_AllReduce_RING_LL_Sum_float")] == (10, 120)
    t = _times(ranks, [slow(0, 1.5)])  # rank 0 arrives at 150
    assert t[(0, "ncclKernel_AllReduce_RING_LL_Sum_float")] == (150, 170)
    assert t[(1, "ncclKernel_AllReduce_RING_LL_Sum_float")] == (10, 170)  # the peer waits 50 µs longer
    link = _times(ranks, [GpuFault("slow_link", (1,), {"factor": 2.0})])
    assert link[(0, "ncclKernel_AllReduce_RING_LL_Sum_float")][1] == 140  # 100 + 2 x 20 on every member


def test_a_slow_link_on_skewed_clocks_never_ends_a_collective_before_it_starts() -> None:
    """Rank 1's clock runs 330 µs ahead: in its trace it joins the all-reduce at 430, long after rank
    0's member ended at 120 (transfer 20 µs). Before the fix the contradicted edge left rank 0's end a
    negative residual (-330), and once rank 0 started later (a slower GEMM) and the link was slow its
    all-reduce ended before it started (the sa_se traces: 85 such events)."""
    ar = "ncclKernel_AllReduce_RING_LL_Sum_float"
    ranks = [_rank(0, [_kernel("gemm", 0, 100), _kernel(ar, 100, 20)], 2),
             _rank(1, [_kernel("gemm", 0, 430), _kernel(ar, 430, 20)], 2)]
    assert _times(ranks, [])[(0, ar)] == (100, 120)  # the input, reproduced
    for factor in (1.5, 3.0, 30.0):
        t = _times(ranks, [slow(0, 2.0), GpuFault("slow_link", (1,), {"factor": factor})])
        assert t[(0, "gemm")] == (0, 200)
        for r in (0, 1):
            start, end = t[(r, ar)]
            assert end - start >= 20 * factor - 1e-6, (factor, r, start, end)
    no_fault = _times(ranks, [GpuFault("slow_link", (1,), {"factor": 1.0})])
    assert no_fault[(0, ar)] == (100, 120) and no_fault[(1, ar)] == (430, 450)


def test_collective_a_rank_that_still_arrives_first_does_not_delay_the_instance() -> None:
    ranks = _allreduce_pair(100.0)
    t = _times(ranks, [slow(1, 5.0)])  # rank 1's gemm 10 -> 50 µs, still before rank 0's 100
    assert t[(1, "gemm")] == (0, 50)
    assert t[(0, "ncclKernel_AllReduce_RING_LL_Sum_float")] == (100, 120)
    assert t[(1, "ncclKernel_AllReduce_RING_LL_Sum_float")] == (50, 120)


def test_sendrecv_peers_are_the_ranks_that_ended_together() -> None:
    # two SendRecv pairs (0<->1 ends at 60, 2<->3 ends at 200): slowing rank 0 must not move 2 and 3
    sr = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"
    ranks = [_rank(0, [_kernel("gemm", 0, 40), _kernel(sr, 40, 20)], 4),
             _rank(1, [_kernel("gemm", 0, 10), _kernel(sr, 10, 50)], 4),
             _rank(2, [_kernel("gemm", 0, 150), _kernel(sr, 150, 50)], 4),
             _rank(3, [_kernel("gemm", 0, 170), _kernel(sr, 170, 30)], 4)]
    t = _times(ranks, [slow(0, 2.0)])
    assert t[(1, sr)][1] == 100  # 0's partner waits: latest start 80 + transfer 20
    assert t[(2, sr)][1] == 200 and t[(3, sr)][1] == 200


def test_sendrecv_pairs_when_ranks_run_different_numbers_of_them() -> None:
    # pipeline-like: rank 0 sends to 1, then to 2; ranks 1 and 2 run one transfer each
    sr = "ncclDevKernel_SendRecv"
    ranks = [_rank(0, [_kernel("gemm", 0, 40), _kernel(sr, 40, 20), _kernel("gemm2", 60, 40), _kernel(sr, 100, 20)], 3),
             _rank(1, [_kernel("gemm", 0, 10), _kernel(sr, 10, 50)], 3),
             _rank(2, [_kernel("gemm", 0, 30), _kernel(sr, 30, 90)], 3)]
    t = _times(ranks, [GpuFault("imbalance", (0,), {"factor": 2.0, "name": "gemm2"})])
    assert t[(1, sr)][1] == 60  # the first transfer is not affected
    assert t[(2, sr)][1] == 160  # rank 2's partner is rank 0's second transfer: 140 + 20


def test_process_groups_from_record_param_comms_keep_instances_apart() -> None:
    # ranks 0,1 all-reduce in group "a", ranks 2,3 in group "b" (record_param_comms args, as newer
    # PyTorch writes them); slowing rank 0 delays its partner 1 and not the other group
    ar = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"

    def rank(r: int, group: str, members: list[int], compute_us: float, end_us: float) -> RankTrace:
        rpc = _host("cpu_op", "record_param_comms", compute_us, 10)
        rpc["args"] = {"Process Group Name": group, "Process Group Ranks": json.dumps(members)}
        return _rank(r, [
            _host("cuda_runtime", "cudaLaunchKernel", 0, 3, corr=1), _kernel("gemm", 5, compute_us, corr=1),
            rpc, _host("cuda_runtime", "cudaLaunchKernel", compute_us + 2, 3, corr=2),
            _kernel(ar, compute_us + 5, end_us - compute_us - 5, corr=2),
        ], 4)

    # as recorded: each group's members end together, the latest arrival + 20 µs
    ranks = [rank(0, "a", [0, 1], 100, 125), rank(1, "a", [0, 1], 50, 125),
             rank(2, "b", [2, 3], 30, 65), rank(3, "b", [2, 3], 40, 65)]
    base = _times(ranks, [])
    assert base[(1, ar)][1] == base[(0, ar)][1] == 125
    t = _times(ranks, [slow(0, 2.0)])
    assert t[(0, ar)][1] == 225 and t[(1, ar)][1] == 225  # stream order: 5 + 200, then + 20
    assert t[(2, ar)] == base[(2, ar)] and t[(3, ar)] == base[(3, ar)]


# --- faults and tiling --------------------------------------------------------------------------

def test_fault_parameters_are_checked() -> None:
    with pytest.raises(ConfigError):
        GpuFault("slow_gpu", (0,), {})
    with pytest.raises(ConfigError):
        GpuFault("slow_gpu", (0,), {"factor": 1.2, "ms": 3})
    with pytest.raises(ConfigError):
        GpuFault("teleport", (0,), {})
    with pytest.raises(ConfigError, match="not in the trace set"):
        retime([_launch_trace()], [slow(3)])
    with pytest.raises(ConfigError, match="no main-thread event"):
        retime([_launch_trace()], [GpuFault("host_stall", (0,), {"ms": 1.0, "before": "nothing like this"})])


def test_tiling_repeats_the_step_with_fresh_ids_and_follows_on_directly() -> None:
    events = [_host("user_annotation", "ProfilerStep#5", 0, 40),
              _host("cuda_runtime", "cudaLaunchKernel", 2, 4, corr=1), _kernel("k", 10, 5, corr=1),
              {"ph": "s", "id": 1, "pid": PID, "tid": TID, "ts": 2, "cat": "ac2g", "name": "ac2g"},
              {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 10, "cat": "ac2g", "name": "ac2g", "bp": "e"}]
    r = _rank(0, events)
    tile([r], 3)
    steps = [e for e in r.events if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert [e["name"] for e in steps] == ["ProfilerStep#5", "ProfilerStep#6", "ProfilerStep#7"]
    corrs = sorted(e["args"]["correlation"] for e in r.events if e.get("cat") == "kernel")
    assert len(set(corrs)) == 3
    # each copy starts when the previous one ends (no recorded gap repeated), same inner timing
    jg, out = retime([r], [])
    starts = sorted(out[2 * i] + jg.origin_us for i, e in enumerate(jg.events) if e.name.startswith("ProfilerStep"))
    assert starts == [0, 40, 80]


def test_a_bad_file_among_good_ones_is_skipped_and_the_rest_written(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for r in (0, 1):
        doc = _allreduce_pair(100.0)[r].doc
        (src / f"rank{r}.json").write_text(json.dumps(doc))
    (src / "rank2.json").write_text("{not json")
    res = mutate_dir(src, tmp_path / "out", [slow(0, 1.5)])
    assert res.ranks == 2
    # each good rank's trace and, beside it, its hardware series (bench/tracefault/hwseries.py); none for rank 2
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rank0.json", "rank0.samples.npz", "rank1.json",
                                                                     "rank1.samples.npz"]
    out1 = json.loads((tmp_path / "out" / "rank1.json").read_text())
    nccl = [e for e in out1["traceEvents"] if "nccl" in e["name"]]
    assert nccl[0]["ts"] + nccl[0]["dur"] == 170  # rank 1 waits for the slowed rank 0 (plain .json in, .json out)


# --- the real dlrm traces -----------------------------------------------------------------------

def _events_by_key(directory: Path) -> dict[tuple[int, str, Any, Any, int], tuple[float, float]]:
    out: dict[tuple[int, str, Any, Any, int], tuple[float, float]] = {}
    for p in sorted(directory.iterdir()):
        doc = json.loads(gzip.open(p).read()) if p.name.endswith(".gz") else json.loads(p.read_text())
        rank = doc["distributedInfo"]["rank"]
        seen: dict[tuple[Any, ...], int] = {}
        for e in doc["traceEvents"]:
            if e.get("ph") != "X":
                continue
            k = (rank, str(e.get("name")), e.get("pid"), e.get("tid"))
            seen[k] = seen.get(k, 0) + 1
            out[(*k, seen[k])] = (e["ts"], e.get("dur", 0))
    return out


def test_identity_on_dlrm_reproduces_the_input_within_1us(tmp_path: Path, dlrm_dir: Path) -> None:
    res = mutate_dir(dlrm_dir, tmp_path / "same", [], steps=1, hardware=False)  # the traces alone
    assert res.identity_within_1us >= 0.99
    before, after = _events_by_key(dlrm_dir), _events_by_key(tmp_path / "same")
    assert before.keys() == after.keys()
    ok = sum(1 for k, (ts, dur) in before.items()
             if abs(after[k][0] - ts) <= 1 and abs(after[k][0] + after[k][1] - ts - dur) <= 1)
    assert ok / len(before) >= 0.99
    src = json.loads(gzip.open(next(dlrm_dir.iterdir())).read())
    out = json.loads(gzip.open(tmp_path / "same" / next(dlrm_dir.iterdir()).name).read())
    assert out["distributedInfo"] == src["distributedInfo"]
    assert set(out) == set(src)
    # laid out like Kineto's own files: tools (HTA) find the rank with a regex on '"rank": N'
    head = gzip.open(tmp_path / "same" / next(dlrm_dir.iterdir()).name).read(4096).decode()
    assert re.search(r'"rank":\s+\d+', head)
    # in fact event for event equal, flows, instants and the profiler span included
    for p in sorted(dlrm_dir.iterdir()):
        assert json.loads(gzip.open(tmp_path / "same" / p.name).read()) == json.loads(gzip.open(p).read()), p.name


def test_a_slowed_gpu_on_dlrm_makes_only_its_peers_wait_longer(dlrm_dir: Path) -> None:
    ranks = read_trace_dir(dlrm_dir)
    jg, base = retime(ranks, [])
    _, slow_t = retime(ranks, [GpuFault("slow_gpu", (7,), {"factor": 8.0})])
    nccl = [i for i, e in enumerate(jg.events) if e.nccl]
    # the culprit's compute stretched; every rank's collectives end no earlier, some later
    assert all(slow_t[2 * i + 1] >= base[2 * i + 1] - 1e-6 for i in nccl)
    assert any(slow_t[2 * i + 1] > base[2 * i + 1] + 100 for i in nccl if jg.events[i].rank != 7)
    # no other rank's compute kernel got longer
    for i, e in enumerate(jg.events):
        if e.gpu and not e.nccl and e.rank != 7:
            assert slow_t[2 * i + 1] - slow_t[2 * i] == pytest.approx(base[2 * i + 1] - base[2 * i])



def test_saves_error_is_relative_above_the_floor_and_absolute_below_it() -> None:
    """saves_error = |pred - truth| / max(truth, SAVES_FLOOR) (issue 28): a 2% truth predicted 53%
    scores 5.1 (the plain relative error would be 25.5), a 2% truth predicted 4% scores 0.2 (plain:
    1.0), and above the floor it is the plain relative error."""
    import dataclasses

    from bench.gpu_faults import SAVES_FLOOR, Outcome, _largest

    @dataclasses.dataclass(frozen=True)
    class Fixed(Outcome):
        truth: float = 0.0
        pred: float = 0.0

        @property
        def saves_truth(self) -> float | None:
            return self.truth

        @property
        def saves_predicted(self) -> float | None:
            return self.pred

    def outcome(truth: float, pred: float) -> Fixed:
        return Fixed(None, None, None, None, 0.0, truth=truth, pred=pred)  # type: ignore[arg-type]

    assert SAVES_FLOOR == 0.10
    tiny_far, tiny_near, big = outcome(0.02, 0.53), outcome(0.02, 0.04), outcome(0.40, 0.30)
    assert tiny_far.saves_error == pytest.approx(5.1) and tiny_far.saves_rel_error == pytest.approx(25.5)
    assert tiny_near.saves_error == pytest.approx(0.2) and tiny_near.saves_rel_error == pytest.approx(1.0)
    assert big.saves_error == pytest.approx(0.25) == big.saves_rel_error
    assert big.saves_abs_error == pytest.approx(0.10)
    assert outcome(0.0, 0.3).saves_error is None  # a fault that cost nothing is not scored
    assert _largest([None, 0.2, 5.1]) == 5.1 and _largest([None]) is None
