"""Hangs and crashes inside a sub-group (issue 31): the culprit's process groups and pipeline stage
are named, and the waiting ranks of the other groups are folded as one hop further. Hand-built
snapshots in the form the runtime sends (``HangSnapshot.groups``: name, description, global ranks,
as torch.distributed describes a 2 x 2 ``init_device_mesh`` with dims ("dp", "tp"))."""

from __future__ import annotations

from perftracker.localizer.diagnose.incidents.crash import localize_crash
from perftracker.localizer.diagnose.incidents.hang import SilentRank, localize_hang
from perftracker.localizer.diagnose.incidents.rank_groups import culprit_clause, hops, stage_of

from perftracker.model import Frame, HangSnapshot

T0 = 1_700_000_000_000_000_000
WORLD = ("0", "default_pg", (0, 1, 2, 3))
TP = {0: ("1", "mesh_tp", (0, 1)), 1: ("1", "mesh_tp", (0, 1)), 2: ("2", "mesh_tp", (2, 3)), 3: ("2", "mesh_tp", (2, 3))}
DP = {0: ("3", "mesh_dp", (0, 2)), 2: ("3", "mesh_dp", (0, 2)), 1: ("4", "mesh_dp", (1, 3)), 3: ("4", "mesh_dp", (1, 3))}
FORWARD_SLEEP = (Frame("mesh_2d.py", 70, "main"), Frame("mesh_2d.py", 40, "forward"))
TP_WAIT = (Frame("mesh_2d.py", 70, "main"), Frame("<lib>/torch/distributed/tensor/parallel/style.py", 300, "_prepare_output_fn"),
           Frame("<lib>/torch/distributed/distributed_c10d.py", 3252, "all_reduce"))
DP_WAIT = (Frame("mesh_2d.py", 72, "main"),
           Frame("<lib>/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 200, "foreach_all_gather"),
           Frame("<lib>/torch/distributed/distributed_c10d.py", 4000, "all_gather_into_tensor"))


def _groups(rank: int, with_groups: bool) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    return (WORLD, TP[rank], DP[rank]) if with_groups else ()


def _snap(rank: int, stack: tuple[Frame, ...], op: str, with_groups: bool = True, **kw: object) -> HangSnapshot:
    return HangSnapshot(job="j", rank=rank, world_size=4, host="h", pid=100 + rank, taken_ns=T0, last_iteration=120,
                        idle_s=30.0, stack=stack, current_op=op, session="s", kernel_state="S futex_do_wait",
                        groups=_groups(rank, with_groups), **kw)  # type: ignore[arg-type]


def _tp_hang(with_groups: bool) -> list[HangSnapshot]:
    return [_snap(1, FORWARD_SLEEP, "time.sleep", with_groups), _snap(0, TP_WAIT, "c10d allreduce", with_groups),
            _snap(3, DP_WAIT, "c10d allgather", with_groups), _snap(2, TP_WAIT, "c10d allreduce", with_groups)]


def test_a_rank_stopped_in_a_tensor_parallel_group_is_named_with_its_groups_and_the_far_waiter_folded() -> None:
    report = localize_hang(_tp_hang(True), {}, [0, 1, 2, 3])
    assert report is not None
    s = report.summary
    assert s.startswith("hang: rank 1 stopped at mesh_2d.py:40 in forward"), s
    assert "(in mesh_dp (ranks 1,3), mesh_tp (ranks 0-1))" in s, s
    assert "ranks 0,3 wait for it in its group, rank 2 one hop further" in s, s
    assert {st.rank for st in report.hang_states if st.state == "culprit"} == {1}


def test_without_groups_the_sentence_names_none() -> None:
    """The twin: the same hang from snapshots of a runtime that could not read the groups."""
    report = localize_hang(_tp_hang(False), {}, [0, 1, 2, 3])
    assert report is not None and "mesh_tp" not in report.summary and "hop" not in report.summary, report.summary
    assert report.summary.startswith("hang: rank 1 stopped at mesh_2d.py:40 in forward"), report.summary


def test_a_stopped_rank_gets_its_groups_from_the_snapshots_that_hold_it() -> None:
    """SIGSTOPped rank 1 sends nothing; its TP partner's and DP partner's snapshots name its groups."""
    snaps = [s for s in _tp_hang(True) if s.rank != 1]
    report = localize_hang(snaps, {1: SilentRank(1, "process stopped", 40.0, 120)}, [0, 1, 2, 3])
    assert report is not None
    assert "rank 1 silent for 40 s (process stopped) (in mesh_dp (ranks 1,3), mesh_tp (ranks 0-1))" in report.summary, \
        report.summary
    assert "rank 2 one hop further" in report.summary, report.summary


def test_groups_the_size_of_the_world_say_nothing_about_hops() -> None:
    """Two ranks, one group: both are near; no group or hop clause."""
    snaps = [HangSnapshot(job="j", rank=r, world_size=2, host="h", pid=r, taken_ns=T0, last_iteration=5, idle_s=30.0,
                          stack=FORWARD_SLEEP if r == 1 else TP_WAIT, current_op="time.sleep" if r == 1 else
                          "c10d allreduce", groups=(("0", "default_pg", (0, 1)),)) for r in (0, 1)]
    report = localize_hang(snaps, {}, [0, 1])
    assert report is not None and "hop" not in report.summary and "(in " not in report.summary, report.summary


PIPE_RAISE = (Frame("pipeline.py", 75, "<module>"), Frame("pipeline.py", 63, "main"),
              Frame("<lib>/torch/distributed/pipelining/schedules.py", 785, "step"),
              Frame("<lib>/torch/distributed/pipelining/stage.py", 640, "forward_one_chunk"),
              Frame("pipeline.py", 30, "forward"))
PIPE_WAIT = (Frame("pipeline.py", 63, "main"), Frame("<lib>/torch/distributed/pipelining/schedules.py", 678,
                                                     "_wait_batch_p2p"))


def test_a_pipeline_stage_that_raises_is_named_with_its_stage() -> None:
    world = ("0", "default_pg", (0, 1))
    bad = HangSnapshot(job="j", rank=1, world_size=2, host="h", pid=11, taken_ns=T0, last_iteration=20, idle_s=0.0,
                       stack=PIPE_RAISE, error="RuntimeError: stage failed at step 20", end="exception",
                       failed_ns=T0, groups=(world,))
    waiting = HangSnapshot(job="j", rank=0, world_size=2, host="h", pid=10, taken_ns=T0 + 10**9, last_iteration=20,
                           idle_s=1.0, stack=PIPE_WAIT, current_op="c10d recv", groups=(world,))
    report = localize_crash([bad, waiting], {}, [0, 1])
    assert report is not None and report.kind == "crash"
    assert report.summary.startswith("crash: rank 1 (pipeline stage 1 of 2) failed with RuntimeError: stage failed"), \
        report.summary


def test_the_stage_is_the_place_in_the_pipeline_group_of_a_dp_x_pp_mesh() -> None:
    groups = [("0", "default_pg", (0, 1, 2, 3)), ("5", "mesh_pp", (2, 3)), ("6", "mesh_dp", (1, 3))]
    assert stage_of(3, groups, PIPE_RAISE, 4) == (1, 2)
    assert stage_of(3, groups, FORWARD_SLEEP, 4) is None  # not in torch.distributed.pipelining
    assert culprit_clause(3, groups, PIPE_RAISE, 4) == "pipeline stage 1 of 2; in mesh_dp (ranks 1,3), mesh_pp (ranks 2-3)"
    assert hops([3], [0, 1, 2], groups, 4) == ([1, 2], [0])
