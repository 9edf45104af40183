"""Process groups of a live window (issue 28): each communication event gets the group of the
recorded torch.distributed call it belongs to (perftracker/runtime/comm_rows.py), and the groups
travel through the wire format into the service's PatternArrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from perftracker.localizer.service.columns import SessionColumns

from perftracker.model import PatternSet, ProcessGroup
from perftracker.model.patterns import Category, Pattern
from perftracker.model.raw_window import COLUMNS, EventKind, RawWindow, WindowMeta
from perftracker.runtime.comm_rows import collective_kind, comm_rows, with_recorded_groups
from perftracker.wire.patterns import batch_from_sets, batch_to_sets, decode_batch, encode_sets

MAIN = 9  # the training thread's native id
RECV_PY = "/x/torch/distributed/distributed_c10d.py(2756): recv"


@dataclass(frozen=True)
class Call:
    kind: str
    group: str
    src: int
    dst: int
    start_ns: int
    end_ns: int
    thread: int = MAIN


def _raw(rows: list[tuple[EventKind, str, int, int, int]]) -> RawWindow:
    """rows: (kind, name, tid, start, end)."""
    names: list[str] = []
    ids = [names.index(n) if n in names else (names.append(n) or len(names) - 1) for _, n, _, _, _ in rows]
    cols = {
        "kind": np.array([int(k) for k, *_ in rows], dtype=COLUMNS["kind"]),
        "name_id": np.array(ids, dtype=COLUMNS["name_id"]),
        "tid": np.array([t for _, _, t, _, _ in rows], dtype=COLUMNS["tid"]),
        "device": np.full(len(rows), -1, dtype=COLUMNS["device"]),
        "start_ns": np.array([s for *_, s, _ in rows], dtype=COLUMNS["start_ns"]),
        "end_ns": np.array([e for *_, e in rows], dtype=COLUMNS["end_ns"]),
        "stack_id": np.full(len(rows), -1, dtype=COLUMNS["stack_id"]),
        "parent": np.full(len(rows), -1, dtype=COLUMNS["parent"]),
    }
    meta = WindowMeta(job="j", session="s", rank=0, world_size=4, host="h", pid=1, training_tid=MAIN,
                      window_start_ns=0, window_end_ns=10_000_000)
    return RawWindow(meta=meta, columns=cols, names=tuple(names))


def test_collective_kind_is_the_same_for_every_layer() -> None:
    for name in ("all_reduce", "c10d::allreduce_", "gloo:all_reduce", "ncclDevKernel_AllReduce_Sum_f32"):
        assert collective_kind(name) == "allreduce"
    assert collective_kind("isend") == collective_kind("c10d::send") == collective_kind("gloo:send") == "send"
    assert collective_kind("c10d::recv_") == "recv"
    assert collective_kind("c10d::_allgather_base_") == collective_kind("all_gather_into_tensor") == "allgather"
    assert collective_kind("reduce_scatter_tensor") == "reducescatter"
    assert collective_kind("aten::mm") == ""


def test_events_get_the_group_of_the_call_they_belong_to() -> None:
    raw = _raw([
        (EventKind.CPU_OP, "c10d::send", MAIN, 1_000, 1_100),  # inside the send call, on its thread
        (EventKind.CPU_OP, "aten::mm", MAIN, 1_200, 1_300),  # inside a call, but not communication
        (EventKind.ANNOTATION, "gloo:all_reduce", -5, 3_500, 3_900),  # gloo's thread: the latest all_reduce call
        (EventKind.PYTHON, RECV_PY, MAIN, 4_999_000, 5_400_000),  # sampled: starts 1 us before its call
        (EventKind.CPU_OP, "c10d::send", MAIN, 9_000_000, 9_000_100),  # no call holds it
    ])
    calls = [Call("send", "1", 0, 1, 900, 2_000), Call("allreduce", "3", -1, -1, 3_000, 3_400),
             Call("recv", "1", 1, 0, 5_000_000, 5_500_000), Call("allreduce", "3", -1, -1, 6_000_000, 6_100_000)]
    rows = comm_rows(raw, calls)
    assert rows == (
        ("c10d::send", 1_000, 1_100, "1", "send", 0, 0, 1),
        ("gloo:all_reduce", 3_500, 3_900, "3", "allreduce", 0, -1, -1),
        (RECV_PY, 4_999_000, 5_400_000, "1", "recv", 1, 1, 0),
    )


def test_a_sampled_frame_takes_a_call_of_its_own_kind_not_the_one_that_holds_its_start() -> None:
    """A sampled recv frame that starts inside the preceding send call (within a sample period)
    belongs to the recv call after it; a c10d op (exact times) keeps the call that holds it."""
    raw = _raw([(EventKind.PYTHON, RECV_PY, MAIN, 1_900_000, 3_000_000),
                (EventKind.CPU_OP, "c10d::recv_", MAIN, 1_900_000, 1_950_000)])
    calls = [Call("send", "1", 0, 1, 1_000_000, 2_000_000), Call("recv", "2", 1, 0, 2_000_500, 3_000_000)]
    rows = {r[0]: r[3] for r in comm_rows(raw, calls)}
    assert rows == {RECV_PY: "2", "c10d::recv_": "1"}


def test_no_calls_no_rows_and_the_window_is_unchanged() -> None:
    raw = _raw([(EventKind.CPU_OP, "c10d::send", MAIN, 1_000, 1_100)])
    assert comm_rows(raw, []) == ()
    assert with_recorded_groups(raw, (), []) is raw


def test_the_recorded_groups_fill_the_windows_meta() -> None:
    raw = _raw([(EventKind.CPU_OP, "c10d::send", MAIN, 1_000, 1_100)])
    groups = (("0", "default_pg", (0, 1, 2, 3)), ("1", "PIPELINE_PARALLEL_GROUP", (0, 1)))
    out = with_recorded_groups(raw, groups, [Call("send", "1", 0, 1, 900, 2_000)])
    assert out.meta.process_groups == groups
    assert out.meta.comm == (("c10d::send", 1_000, 1_100, "1", "send", 0, 0, 1),)


def _set(rank: int, groups: tuple[ProcessGroup, ...]) -> PatternSet:
    return PatternSet(job="j", session="s", rank=rank, world_size=4, host="h", window_start_ns=0,
                      window_end_ns=1_000_000_000,
                      patterns=(Pattern("aten::mm", Category.COMPUTE, 0.5, 0.5, 0.1),
                                Pattern("gloo:all_reduce", Category.COLLECTIVE, 0.2, 0.5, 0.1)),
                      groups=groups, comm={"gloo:all_reduce": (groups[-1].name,)} if groups else {},
                      steps_ms=(10.0, 11.0, 12.0, 10.5) if groups else (), step_group=groups[-1].name if groups else "")


def _dp2pp2() -> list[PatternSet]:
    out = []
    for r in range(4):
        pp, dp = (0, 1) if r < 2 else (2, 3), (r % 2, r % 2 + 2)
        out.append(_set(r, (ProcessGroup(f"pp{pp[0]}", "PIPELINE_PARALLEL_GROUP", pp, True),
                            ProcessGroup(f"dp{dp[0]}", "DATA_PARALLEL_GROUP", dp, False))))
    return out


def test_groups_travel_through_the_wire_into_the_services_arrays() -> None:
    sets = _dp2pp2()
    batch = decode_batch(encode_sets(sets))
    back = batch_to_sets(batch)
    assert [b.groups for b in back] == [s.groups for s in sets]
    assert [dict(b.comm) for b in back] == [dict(s.comm) for s in sets]
    assert [b.steps_ms for b in back] == [s.steps_ms for s in sets]
    cols = SessionColumns("j", "s")
    cols.add(batch)
    arr = cols.to_arrays()
    assert arr.job_groups.read and len(arr.job_groups.groups) == 4
    assert arr.stage is not None and arr.stage.tolist() == [0, 1, 0, 1]
    assert arr.job_groups.steps is not None and arr.job_groups.steps.shape == (4, 4)


def test_a_batch_without_groups_carries_none() -> None:
    """The twin: windows that read no group give the service no group (and the wire stays as before)."""
    sets = [_set(r, ()) for r in range(4)]
    batch = batch_from_sets(sets)
    assert all(not w.groups and not w.comm for w in batch.workers)
    cols = SessionColumns("j", "s")
    cols.add(decode_batch(encode_sets(sets)))
    arr = cols.to_arrays()
    assert not arr.job_groups.read and arr.stage is None
