"""Hang localization on hand-built snapshots (stacks copied from what gloo ranks really showed)."""

from __future__ import annotations

import dataclasses
import re

from perftracker.localizer.diagnose.incidents.hang import (
    HangOptions,
    SilentRank,
    localize_hang,
    place,
)

from perftracker.model import Frame, HangSnapshot, Report

T0 = 1_700_000_000_000_000_000

# rank waiting for DDP's gradient allreduce (torch 2.13, gloo): no torch/distributed frame at all
DDP_BACKWARD = (
    Frame("perftracker/examples/train.py", 120, "main"),
    Frame("perftracker/examples/train.py", 95, "train_step"),
    Frame("<lib>/torch/_tensor.py", 623, "backward"),
    Frame("<lib>/torch/autograd/__init__.py", 395, "backward"),
    Frame("<lib>/torch/autograd/graph.py", 979, "_engine_run_backward"),
)
ALLREDUCE = (
    Frame("perftracker/examples/train.py", 120, "main"),
    Frame("perftracker/examples/train.py", 101, "train_step"),
    Frame("<lib>/torch/distributed/c10d_logger.py", 83, "wrapper"),
    Frame("<lib>/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
)
BARRIER = (
    Frame("perftracker/examples/train.py", 120, "main"),
    Frame("perftracker/examples/train.py", 130, "save"),
    Frame("<lib>/torch/distributed/c10d_logger.py", 83, "wrapper"),
    Frame("<lib>/torch/distributed/distributed_c10d.py", 5356, "barrier"),
)
# a rank sleeping in its own forward, under DDP's forward
FORWARD_SLEEP = (
    Frame("perftracker/examples/train.py", 120, "main"),
    Frame("perftracker/examples/train.py", 93, "train_step"),
    Frame("<lib>/torch/nn/modules/module.py", 1779, "_call_impl"),
    Frame("<lib>/torch/nn/parallel/distributed.py", 1700, "forward"),
    Frame("<lib>/torch/nn/parallel/distributed.py", 1520, "_run_ddp_forward"),
    Frame("<lib>/torch/nn/modules/module.py", 1779, "_call_impl"),
    Frame("perftracker/examples/train.py", 88, "forward"),
)
CHECKPOINT = (
    Frame("perftracker/examples/train.py", 120, "main"),
    Frame("perftracker/examples/train.py", 140, "save_checkpoint"),
    Frame("<lib>/torch/serialization.py", 966, "save"),
)


def snap(rank: int, stack: tuple[Frame, ...], op: str = "", kernel: str = "S futex_do_wait",
         idle_s: float = 12.0, it: int = 301, world: int = 4, taken_ns: int = T0) -> HangSnapshot:
    return HangSnapshot(job="j", rank=rank, world_size=world, host=f"h{rank}", pid=100 + rank,
                        taken_ns=taken_ns, last_iteration=it, idle_s=idle_s, stack=stack,
                        current_op=op, last_event="optimizer.step", session="s1", kernel_state=kernel)


def culprits(report: Report) -> list[int]:
    return [s.rank for s in report.hang_states if s.state in ("culprit", "silent")]


def test_rank_hanging_in_forward_is_named_with_place_and_call() -> None:
    snaps = [snap(r, DDP_BACKWARD, "c10d allreduce (DDP backward)") for r in (0, 1, 3)]
    snaps.append(snap(2, FORWARD_SLEEP, "time.sleep", kernel="S hrtimer_nanosleep"))
    report = localize_hang(snaps, {}, [0, 1, 2, 3])
    assert report is not None and report.kind == "hang"
    assert culprits(report) == [2]
    states = {s.rank: s for s in report.hang_states}
    assert states[2].where == "perftracker/examples/train.py:88 in forward (time.sleep) via main > train_step"
    assert {states[r].state for r in (0, 1, 3)} == {"waiting"}
    assert report.summary == ("hang: rank 2 stopped at perftracker/examples/train.py:88 in forward (time.sleep) via main > "
                              "train_step since iteration 301; all other ranks wait in c10d allreduce (DDP backward)")
    assert report.ranks_reported == (0, 1, 2, 3) and report.ranks_missing == ()
    assert Report.from_dict(report.to_dict()) == report


def test_waiting_is_recognised_from_the_stack_when_current_op_is_missing() -> None:
    # older agents / other paths may not fill current_op: the stack alone must do
    snaps = [snap(0, DDP_BACKWARD), snap(1, ALLREDUCE), snap(2, FORWARD_SLEEP, kernel="S hrtimer_nanosleep")]
    report = localize_hang(snaps, {}, [0, 1, 2])
    assert report is not None
    assert culprits(report) == [2]
    where = {s.rank: s.where for s in report.hang_states}
    assert where[0] == "c10d allreduce (DDP backward)" and where[1] == "c10d allreduce"
    assert "rank 0 waits in c10d allreduce (DDP backward)" in report.summary
    assert "rank 1 waits in c10d allreduce" in report.summary


def test_a_running_backward_is_not_a_collective_wait() -> None:
    p = place(snap(0, DDP_BACKWARD, kernel="R"))
    assert not p.waiting
    assert p.where.startswith("perftracker/examples/train.py:95 in train_step")


def test_every_rank_in_one_collective_is_a_network_hang_naming_no_rank() -> None:
    snaps = [snap(r, ALLREDUCE, "c10d allreduce") for r in range(4)]
    report = localize_hang(snaps, {}, range(4))
    assert report is not None
    assert culprits(report) == []
    assert all(s.state == "waiting" for s in report.hang_states)
    assert "network or collective hang" in report.summary
    assert "all 4 ranks wait in c10d allreduce" in report.summary
    assert re.search(r"ranks? \d", report.summary) is None  # names no rank


def test_silent_stopped_rank_is_named_with_liveness_detail() -> None:
    snaps = [snap(r, DDP_BACKWARD, "c10d allreduce (DDP backward)") for r in (0, 1, 3)]
    silent = {2: SilentRank(2, "process stopped", silent_s=40.2, last_iteration=300)}
    report = localize_hang(snaps, silent, [0, 1, 2, 3])
    assert report is not None
    assert culprits(report) == [2]
    st = {s.rank: s for s in report.hang_states}[2]
    assert st.state == "silent" and st.detail == "process stopped" and st.last_iteration == 300
    assert report.summary == ("hang: rank 2 silent for 40 s (process stopped); "
                              "all other ranks wait in c10d allreduce (DDP backward)")
    assert report.ranks_missing == (2,)


def test_expected_rank_without_snapshot_or_note_is_silent() -> None:
    snaps = [snap(r, ALLREDUCE, "c10d allreduce") for r in (0, 1, 2)]
    report = localize_hang(snaps, {}, [0, 1, 2, 3])
    assert report is not None
    assert culprits(report) == [3]
    assert report.summary.startswith("hang: rank 3 silent")
    # a plain string note (what sessions derive from heartbeats) is accepted too
    report = localize_hang(snaps, {3: "process dead"}, [0, 1, 2, 3])
    assert report is not None and "rank 3 silent (process dead)" in report.summary


def test_mismatched_collectives_name_the_minority() -> None:
    snaps = [snap(r, ALLREDUCE, "c10d allreduce") for r in (0, 1, 3)] + [snap(2, BARRIER, "c10d barrier")]
    report = localize_hang(snaps, {}, range(4))
    assert report is not None
    assert culprits(report) == [2]
    assert "rank 2 waits in c10d barrier" in report.summary and "mismatched" in report.summary


def test_all_ranks_pausing_in_the_same_user_code_below_pause_is_not_a_hang() -> None:
    snaps = [snap(r, CHECKPOINT, "torch.save", kernel="D", idle_s=8.0) for r in range(4)]
    assert localize_hang(snaps, {}, range(4), HangOptions(pause_s=30.0)) is None


def test_a_pause_that_outlasts_pause_s_becomes_a_hang_naming_no_rank() -> None:
    snaps = [snap(r, CHECKPOINT, "torch.save", kernel="D", idle_s=8.0) for r in range(4)]
    # aged to now: 8 s at the snapshot + 25 s since = 33 s > 30 s
    report = localize_hang(snaps, {}, range(4), HangOptions(pause_s=30.0), now_ns=T0 + 25 * 10**9)
    assert report is not None
    assert culprits(report) == []
    assert report.summary.startswith("hang: all 4 ranks stopped at perftracker/examples/train.py:140 in save_checkpoint "
                                     "(torch.save) via main for 33 s")
    # below the pause at the same age: still nothing
    assert localize_hang(snaps, {}, range(4), HangOptions(pause_s=60.0), now_ns=T0 + 25 * 10**9) is None


def test_latest_snapshot_per_rank_wins() -> None:
    old = snap(2, FORWARD_SLEEP, "time.sleep", taken_ns=T0 - 10**9)
    new = snap(2, ALLREDUCE, "c10d allreduce", taken_ns=T0)
    report = localize_hang([new, old] + [snap(r, ALLREDUCE, "c10d allreduce") for r in (0, 1, 3)], {}, range(4))
    assert report is not None and culprits(report) == []


def test_perftracker_frames_do_not_split_groups() -> None:
    hook = Frame("<perftracker>/hooks.py", 40, "_next")
    a = snap(0, CHECKPOINT, "torch.save", idle_s=100.0)
    b = snap(1, CHECKPOINT[:1] + (hook,) + CHECKPOINT[1:], "torch.save", idle_s=100.0)
    report = localize_hang([a, b], {}, [0, 1], HangOptions(pause_s=30.0))
    assert report is not None
    assert len({s.signature for s in report.hang_states}) == 1


def test_two_user_places_without_collectives_name_the_minority_after_the_pause() -> None:
    snaps = [snap(r, CHECKPOINT, "torch.save", idle_s=90.0) for r in (0, 1, 2)]
    snaps.append(snap(3, FORWARD_SLEEP, "time.sleep", idle_s=90.0))
    assert localize_hang(snaps, {}, range(4), HangOptions(pause_s=120.0)) is None
    report = localize_hang(snaps, {}, range(4), HangOptions(pause_s=60.0))
    assert report is not None and culprits(report) == [3]
    assert "rank 3 stopped at perftracker/examples/train.py:88 in forward (time.sleep)" in report.summary


def test_nothing_in_nothing_out() -> None:
    assert localize_hang([], {}, []) is None


def test_liveness_words_and_resume() -> None:
    from perftracker.localizer.diagnose.incidents.hang import (
        job_resumed,
        never_answers,
        silent_detail,
    )

    assert silent_detail(False, "tracking") == "process dead"
    assert silent_detail(True, "stopped") == "process stopped"
    assert silent_detail(True, "tracking") == "process running but silent (phase tracking)"
    assert never_answers(True, "stopped") and never_answers(False, "") and not never_answers(True, "silent")
    assert not never_answers(False, "exited")  # its exit snapshot may still be on the way
    snaps = [snap(0, ALLREDUCE, "c10d allreduce", it=301), snap(1, CHECKPOINT, "torch.save", it=301)]
    assert not job_resumed(snaps, [(0, 301, T0 + 10**9), (1, 301, T0 + 10**9)])
    assert not job_resumed(snaps, [(0, 305, T0 - 10**9)])  # a heartbeat from before the snapshot
    assert job_resumed(snaps, [(0, 301, T0 + 10**9), (1, 302, T0 + 2 * 10**9)])


def test_pause_s_comes_from_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PERFTRACKER_HANG_PAUSE_S", "12.5")
    assert HangOptions.from_env().pause_s == 12.5


def test_a_killed_rank_whose_peers_failed_in_the_collective_is_named() -> None:
    err = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
           "[127.0.0.1]:11496: Connection reset by peer. This is typically caused by a remote worker hanging")
    snaps = [dataclasses.replace(snap(r, DDP_BACKWARD, "c10d allreduce (DDP backward)", kernel=""), error=err)
             for r in (0, 1, 2)]
    report = localize_hang(snaps, {3: SilentRank(3, "process dead")}, range(4))
    assert report is not None and culprits(report) == [3]
    assert report.summary == ("hang: rank 3 silent (process dead); all other ranks failed (Connection reset by "
                              "peer) in c10d allreduce (DDP backward)")
    assert {s.rank: s.detail for s in report.hang_states}[0] == err


def test_ranks_that_died_after_another_are_not_culprits() -> None:
    from perftracker.localizer.diagnose.incidents.hang import silent_detail

    silent = {1: silent_detail(False, "dead"), 0: silent_detail(False, "dead after rank 1")}
    assert silent[0] == "process dead after rank 1"
    report = localize_hang([], silent, [0, 1])
    assert report is not None and culprits(report) == [1]
    st = {s.rank: s for s in report.hang_states}
    assert st[0].state == "waiting" and st[0].where == "unknown: died after rank 1"
    assert report.summary == "hang: rank 1 silent (process dead); rank 0 died after rank 1 (stopped by the launcher)"
    assert report.ranks_missing == (0, 1)
    # a follower of a rank that is not silent, or of another follower, stays a culprit
    report = localize_hang([], {0: "process dead after rank 1", 1: "process dead after rank 0"}, [0, 1])
    assert report is not None and culprits(report) == [0, 1]


def test_a_snapshot_with_a_stack_beats_a_later_empty_one() -> None:
    empty = snap(0, (), "", kernel="R", taken_ns=T0 + 10**9)
    full = snap(0, ALLREDUCE, "c10d allreduce", taken_ns=T0)
    report = localize_hang([full, empty, snap(1, FORWARD_SLEEP, "time.sleep")], {}, [0, 1])
    assert report is not None and culprits(report) == [1]


def test_error_gist() -> None:
    from perftracker.localizer.diagnose.incidents.hang import _short_error

    assert _short_error("RuntimeError: [pair.cc:589] Connection closed by peer [127.0.0.1]:5512") == \
        "Connection closed by peer"
    assert _short_error("RuntimeError: Timed out waiting 1800000ms for recv operation") == "Timed out"
    assert _short_error("ValueError: bad") == "ValueError"
