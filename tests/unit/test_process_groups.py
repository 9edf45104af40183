"""Process groups read from Kineto traces, carried through the summary (issue 28, step 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from perftracker.agent.kineto import RankInfo, process_groups, window_from_trace
from perftracker.agent.summarize.groups import busy_between
from perftracker.agent.summarize.summarizer import summarize_window
from perftracker.localizer.diagnose.method.arrays import pattern_sets_to_arrays

from perftracker.model import PatternSet, ProcessGroup


def _kernel(name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


def _doc(rank: int, steps: list[float], ranks_form: str = "string") -> dict[str, Any]:
    """One rank of a DP2 x PP2 job: per step a compute kernel of the given length (us), a send to
    its pipeline partner and a data-parallel all-reduce."""
    dp = [rank % 2, rank % 2 + 2]
    pp = [rank - rank % 2, rank - rank % 2 + 1]
    events = []
    t = 0.0
    for i, c in enumerate(steps):
        events.append(_kernel("gemm_kernel", t, c))
        t += c
        members: Any = str(pp) if ranks_form == "string" else pp
        events.append(_kernel("ncclDevKernel_SendRecv", t, 5.0, **{
            "Collective name": "send", "Process Group Name": f"pp{pp[0]}", "Process Group Ranks": members,
            "Seq": i, "Src Rank": rank, "Dst Rank": pp[1 - rank % 2]}))
        t += 5.0
        events.append(_kernel("ncclDevKernel_AllReduce_Sum_f32", t, 20.0, **{
            "Collective name": "allreduce", "Process Group Name": f"dp{rank % 2}",
            "Process Group Description": "DATA_PARALLEL_GROUP",
            "Process Group Ranks": str(dp) if ranks_form == "string" else dp, "Seq": i}))
        t += 20.0
    info = {"rank": rank, "world_size": 4, "pg_config": [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
        {"pg_name": f"dp{rank % 2}", "pg_desc": "DATA_PARALLEL_GROUP", "ranks": dp},
    ]}
    return {"distributedInfo": info, "traceEvents": events}


@pytest.mark.parametrize("form", ["string", "list"])
def test_groups_and_collectives_are_read_in_both_forms(form: str) -> None:
    groups, comm = process_groups(_doc(1, [100.0] * 4, form))
    by_name = {g[0]: g for g in groups}
    assert by_name["dp1"] == ("dp1", "DATA_PARALLEL_GROUP", (1, 3))
    assert by_name["pp0"] == ("pp0", "", (0, 1))  # named only by its events: members from them
    sends = [c for c in comm if c[4] == "send"]
    assert len(sends) == 4 and sends[0][6:] == (1, 0) and sends[2][5] == 2


def test_malformed_group_fields_are_dropped_not_fatal() -> None:
    doc = _doc(0, [100.0] * 4)
    doc["traceEvents"].append(_kernel("x", 1.0, 1.0, **{"Process Group Name": "bad", "Process Group Ranks": "[1, x]"}))
    doc["traceEvents"].append(_kernel("y", float("nan"), 1.0, **{"Process Group Name": "nan"}))
    doc["traceEvents"].append(_kernel("z", 1.0, 1.0, **{"Process Group Name": True}))
    groups, comm = process_groups(doc)
    assert ("bad", "", ()) in groups
    assert all(c[3] != "nan" for c in comm) and all(c[0] != "z" for c in comm)


def test_no_metadata_no_groups() -> None:
    doc = {"distributedInfo": {"rank": 0}, "traceEvents": [_kernel("gemm", 0.0, 10.0)]}
    assert process_groups(doc) == ((), ())


def test_the_summary_carries_groups_collectives_and_steps() -> None:
    steps = [100.0, 150.0, 120.0, 130.0, 110.0]
    raw = window_from_trace(_doc(2, steps), Path("r2.json"), RankInfo(2, 4, "distributedInfo"))
    ps = summarize_window(raw)
    names = {g.name: g for g in ps.groups}
    assert names["dp0"].ranks == (0, 2) and not names["dp0"].p2p
    assert names["pp2"].p2p and names["pp2"].ranks == (2, 3)
    assert ps.comm["ncclDevKernel_SendRecv"] == ("pp2",)
    assert ps.step_group == "dp0"
    # compute between consecutive all-reduce ends: the steps after the first
    assert ps.steps_ms == pytest.approx([c / 1000 for c in steps[1:]])
    again = PatternSet.from_bytes(ps.to_bytes())
    assert again.groups == ps.groups and again.comm == ps.comm and again.steps_ms == ps.steps_ms


def test_too_few_steps_carry_none() -> None:
    raw = window_from_trace(_doc(0, [100.0] * 3), Path("r0.json"), RankInfo(0, 4, "distributedInfo"))
    ps = summarize_window(raw)
    assert ps.groups and ps.steps_ms == ()


def test_busy_between_counts_the_union_of_overlapping_intervals() -> None:
    start = np.array([0, 5, 20, 40], dtype=np.int64)
    end = np.array([10, 12, 30, 45], dtype=np.int64)
    assert busy_between(start, end, np.array([0, 15, 25, 50])).tolist() == [12.0, 5.0, 10.0]


def test_arrays_know_each_workers_groups_and_stage() -> None:
    sets = []
    for r in range(4):
        raw = window_from_trace(_doc(r, [100.0] * 5), Path(f"r{r}.json"), RankInfo(r, 4, "distributedInfo"))
        sets.append(summarize_window(raw))
    arr = pattern_sets_to_arrays(sets)
    assert arr.job_groups.read
    assert arr.stage is not None and arr.stage.tolist() == [0, 1, 0, 1]
    steps = arr.job_groups.steps
    assert steps is not None and steps.shape == (4, 4)


def test_rank_ranges_encode_compactly() -> None:
    g = ProcessGroup("2", "DATA_PARALLEL_GROUP", tuple(range(1, 64, 2)))
    assert g.to_list()[2] == {"start": 1, "stop": 65, "step": 2}
    assert ProcessGroup.from_list(g.to_list(), "g") == g


def test_a_collective_named_on_its_kernel_and_its_record_param_comms_is_one_record() -> None:
    doc = _doc(0, [100.0] * 4)
    for ev in list(doc["traceEvents"]):
        if "args" in ev:  # the same fields on the CPU op that launched it, as real NCCL traces write them
            doc["traceEvents"].append({**ev, "cat": "cpu_op", "name": "record_param_comms", "tid": 1})
    _, comm = process_groups(doc)
    assert comm and all(c[0] != "record_param_comms" for c in comm)
    kernels_only = {"distributedInfo": doc["distributedInfo"],
                    "traceEvents": [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]}
    _, host = process_groups(kernels_only)  # no kernel names a group: the CPU records are used
    assert host and all(c[0] == "record_param_comms" for c in host)


def test_a_kernel_name_shared_by_two_groups_is_one_function_per_group() -> None:
    doc = _doc(0, [100.0] * 5)
    t = 10_000.0
    for i in range(5):  # the same all-reduce kernel in a second group, as an embedding group runs it
        doc["traceEvents"].append(_kernel("ncclDevKernel_AllReduce_Sum_f32", t + 100 * i, 30.0, **{
            "Collective name": "allreduce", "Process Group Name": "emb0", "Process Group Description":
            "EMBEDDING_GROUP", "Process Group Ranks": "[0, 1]", "Seq": i}))
    ps = summarize_window(window_from_trace(doc, Path("r0.json"), RankInfo(0, 4, "distributedInfo")))
    keys = {p.key for p in ps.patterns}
    assert {"ncclDevKernel_AllReduce_Sum_f32 [DATA_PARALLEL_GROUP]",
            "ncclDevKernel_AllReduce_Sum_f32 [EMBEDDING_GROUP]"} <= keys
    assert "ncclDevKernel_AllReduce_Sum_f32" not in keys
    assert ps.comm["ncclDevKernel_AllReduce_Sum_f32 [EMBEDDING_GROUP]"] == ("emb0",)
    single = summarize_window(window_from_trace(_doc(0, [100.0] * 5), Path("r0.json"),
                                                RankInfo(0, 4, "distributedInfo")))
    assert "ncclDevKernel_AllReduce_Sum_f32" in {p.key for p in single.patterns}  # one group: its own name
