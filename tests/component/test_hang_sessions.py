"""Hang sessions over a real sqlite store with a fake clock: silent ranks, pauses, recovery."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from perftracker.localizer.service.session.manager import SessionManager, SessionOptions
from perftracker.localizer.service.validate import Heartbeat, RankBeat, Registration, WorkerInfo
from perftracker.localizer.store.sqlite_store import Store

from perftracker.clock import FakeClock
from perftracker.model import Frame, HangSnapshot

T0 = 1_700_000_000 * 10**9
BACKWARD = (Frame("train.py", 90, "main"), Frame("<lib>/torch/autograd/graph.py", 979, "_engine_run_backward"))
SAVE = (Frame("train.py", 90, "main"), Frame("train.py", 140, "save_checkpoint"))


@pytest.fixture
def mgr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SessionManager:
    monkeypatch.setenv("PERFTRACKER_HANG_PAUSE_S", "30")
    m = SessionManager(Store(tmp_path / "s.sqlite"), FakeClock(T0),
                       SessionOptions(hang_collect_s=20.0, hang_recheck_s=5.0))
    m.register(Registration("j", "a", "h", tuple(WorkerInfo(r, r, 3, 100 + r, 100 + r, "h") for r in range(3))))
    return m


def _snap(rank: int, stack: tuple[Frame, ...], op: str, kernel: str, it: int = 50, idle_s: float = 6.0,
          taken_ns: int = T0) -> HangSnapshot:
    return HangSnapshot("j", rank, 3, "h", 100 + rank, taken_ns, it, idle_s, stack, current_op=op,
                        kernel_state=kernel)


def _beat(mgr: SessionManager, rank: int, it: int, phase: str = "tracking", alive: bool = True) -> None:
    mgr.heartbeat(Heartbeat("j", "a", (RankBeat(rank, it, phase, 6.0, alive, 10.0),)))


def test_a_stopped_rank_completes_the_session_at_once_and_is_named(mgr: SessionManager) -> None:
    s = mgr.accept_hang_snapshot(_snap(0, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait"))
    mgr.accept_hang_snapshot(_snap(2, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait"))
    s = mgr.store.get_session(s.session)  # type: ignore[assignment]
    assert s is not None and not mgr.is_complete(s)
    _beat(mgr, 1, 50, phase="stopped")  # the agent saw state T in /proc
    assert mgr.is_complete(mgr.store.get_session(s.session))  # type: ignore[arg-type]
    mgr.localize_now(s.session)
    report = mgr.store.get_report(s.session)
    assert report is not None and report.status == "complete"
    assert report.summary.startswith("hang: rank 1 silent for ")
    assert "(process stopped); all other ranks wait in c10d allreduce (DDP backward)" in report.summary
    # recovery: SIGCONT, the job moves on -> the stored report is marked resolved
    _beat(mgr, 0, 50)
    assert mgr.store.get_report(s.session).status == "complete"  # type: ignore[union-attr]
    mgr.clock.advance_s(2)  # type: ignore[attr-defined]
    _beat(mgr, 0, 52)
    resolved = mgr.store.get_report(s.session)
    assert resolved is not None and resolved.status == "resolved" and "resumed" in resolved.summary
    # detection goes on: a new blocked snapshot opens a new session
    s2 = mgr.accept_hang_snapshot(_snap(0, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait", it=80,
                                        taken_ns=T0 + 10**10))
    assert s2.session != s.session and s2.state == "open"


def test_a_late_report_of_a_reported_hang_opens_no_second_session(mgr: SessionManager) -> None:
    """Each rank's detector reports the same hang a few hundred ms apart; once the first session is
    reported, a slower rank's own report of the same stop (same last iteration) joins nothing new."""
    s = mgr.accept_hang_snapshot(_snap(0, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait"))
    for r in (1, 2):
        mgr.accept_hang_snapshot(dataclasses.replace(
            _snap(r, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait"), session=s.session))
    mgr.localize_now(s.session)
    assert mgr.store.get_report(s.session) is not None
    late = mgr.accept_hang_snapshot(_snap(2, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait"))
    assert late.session == s.session
    assert [x.session for x in mgr.store.sessions(job="j")] == [s.session]
    # a rank stopped at another iteration is another hang: a new session
    other = mgr.accept_hang_snapshot(_snap(2, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait", it=90))
    assert other.session != s.session


def test_an_all_rank_pause_stores_no_report_and_closes_when_the_job_resumes(mgr: SessionManager) -> None:
    s = None
    for r in range(3):
        s = mgr.accept_hang_snapshot(_snap(r, SAVE, "torch.save", "D"))
    assert s is not None and mgr.is_complete(s)
    end = mgr.localize_now(s.session)
    assert end is not None and end.state == "open"  # not a hang yet: looked at again later
    assert end.deadline_ns == T0 + 5 * 10**9
    assert mgr.store.get_report(s.session) is None
    assert mgr.due() == []  # complete, but not due again before the recheck
    mgr.clock.advance_s(5)  # type: ignore[attr-defined]
    assert [d.session for d in mgr.due()] == [s.session]
    for r in range(3):
        _beat(mgr, r, 51)  # the save finished, training goes on
    end = mgr.localize_now(s.session)
    assert end is not None and end.state == "done" and "no hang" in end.error
    assert mgr.store.get_report(s.session) is None


def test_a_pause_that_outlasts_pause_s_becomes_a_hang_report(mgr: SessionManager) -> None:
    s = None
    for r in range(3):
        s = mgr.accept_hang_snapshot(_snap(r, SAVE, "torch.save", "D"))
    assert s is not None
    assert mgr.localize_now(s.session).state == "open"  # type: ignore[union-attr]
    mgr.clock.advance_s(25)  # 6 s idle at the snapshot + 25 s > 30 s, no progress in heartbeats
    end = mgr.localize_now(s.session)
    assert end is not None and end.state == "done"
    report = mgr.store.get_report(s.session)
    assert report is not None and report.kind == "hang"
    assert report.summary.startswith("hang: all 3 ranks stopped at train.py:140 in save_checkpoint (torch.save)")


def test_a_death_during_a_slowdown_session_opens_a_hang_session_linked_to_it(mgr: SessionManager) -> None:
    slow, _ = mgr.trigger("j", "slowdown on rank 0")
    assert slow.kind == "slowdown"
    s, joined = mgr.trigger("j", "hang: rank 1 process died", kind="hang")
    assert not joined and s.session != slow.session and s.kind == "hang"
    assert s.reason == f"hang: rank 1 process died (during slowdown session {slow.session})"
    assert s.deadline_ns == T0 + 20 * 10**9
    still = mgr.store.get_session(slow.session)
    assert still is not None and still.kind == "slowdown" and still.state == "open"  # its window's data stays
    _beat(mgr, 1, 50, phase="dead", alive=False)
    for r in (0, 2):
        _beat(mgr, r, 50, phase="dead after rank 1", alive=False)
    assert s.session in [d.session for d in mgr.due()]  # everyone is dead: no need to wait
    mgr.localize_now(s.session)
    report = mgr.store.get_report(s.session)
    assert report is not None and [st.rank for st in report.hang_states if st.state == "silent"] == [1]
    assert report.summary.startswith("hang: rank 1 silent")
    assert "ranks 0,2 died after rank 1" in report.summary


WINDOW_STOP = (Frame("train.py", 90, "main"), Frame("<perftracker>/runtime.py", 230, "_boundary"),
               Frame("<perftracker>/window.py", 200, "on_boundary"),
               Frame("<lib>/torch/profiler/profiler.py", 700, "stop"))


def test_a_hang_snapshot_during_a_slowdown_window_opens_its_own_hang_session(mgr: SessionManager) -> None:
    """Issue 19: the detector fired on noise and opened a window; a peer was SIGSTOPped in it. The
    blocked snapshots open a hang session of their own (linked by its reason), not the slowdown one."""
    slow, _ = mgr.trigger("j", "rank 0: slowdown at iteration 272")
    first = mgr.accept_hang_snapshot(_snap(0, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait"))
    second = mgr.accept_hang_snapshot(_snap(2, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait"))
    assert first.session == second.session != slow.session and first.kind == "hang"
    assert first.uploaded == (0,) and second.uploaded == (0, 2)
    hang = mgr.store.get_session(first.session)
    assert hang is not None and f"during slowdown session {slow.session}" in hang.reason
    _beat(mgr, 1, 300, phase="stopped")
    mgr.localize_now(first.session)
    report = mgr.store.get_report(first.session)
    assert report is not None and report.summary.startswith("hang: rank 1 silent for ")
    assert f"during slowdown session {slow.session}" in report.trigger_reason


def test_a_rank_stalled_in_the_profiler_stop_is_a_pause_and_a_stopped_peer_is_a_hang(mgr: SessionManager) -> None:
    """The others wait for a rank whose training thread is in perftracker's window code (stopping the
    profiler): a pause below PERFTRACKER_HANG_PAUSE_S, no report. The same wait for a rank that is
    stopped (procfs state T) is a hang at once."""
    s = mgr.accept_hang_snapshot(_snap(0, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait"))
    mgr.accept_hang_snapshot(_snap(1, WINDOW_STOP, "", "R", idle_s=8.0))
    mgr.accept_hang_snapshot(_snap(2, BACKWARD, "c10d allreduce (DDP backward)", "S futex_do_wait"))
    assert mgr.localize_now(s.session).state == "open"  # type: ignore[union-attr]
    assert mgr.store.get_report(s.session) is None
    mgr.clock.advance_s(25)  # type: ignore[attr-defined]  # 8 s idle + 25 s > 30 s: no longer a pause
    mgr.localize_now(s.session)
    report = mgr.store.get_report(s.session)
    assert report is not None and [st.rank for st in report.hang_states if st.state == "culprit"] == [1]
