"""The session state machine, with a fake clock over a real sqlite store."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from perftracker.localizer.service.session.manager import SessionManager, SessionOptions
from perftracker.localizer.service.validate import (
    Heartbeat,
    RankBeat,
    Registration,
    RequestError,
    WorkerInfo,
)
from perftracker.localizer.store.sqlite_store import Store

from perftracker.clock import FakeClock
from perftracker.model import Frame, HangSnapshot
from tests.service_helpers import make_pattern_set

HAVE_LOCALIZE = importlib.util.find_spec("perftracker.localizer.diagnose.localize") is not None
HAVE_HANG = importlib.util.find_spec("perftracker.localizer.diagnose.incidents.hang") is not None
T0 = 1_700_000_000 * 10**9


def _reg(job: str, agent: str, ranks: list[int], world: int) -> Registration:
    return Registration(job, agent, "h", tuple(WorkerInfo(r, r, world, 100 + r, 100 + r, "h") for r in ranks))


@pytest.fixture
def mgr(tmp_path: Path) -> SessionManager:
    return SessionManager(Store(tmp_path / "s.sqlite"), FakeClock(T0),
                          SessionOptions(default_window_s=2.0, collect_grace_s=10.0, hang_collect_s=5.0))


def test_trigger_opens_one_session_per_job_and_later_triggers_join(mgr: SessionManager) -> None:
    mgr.register(_reg("j", "a", [0, 1], 2))
    s, joined = mgr.trigger("j", "slowdown on rank 1")
    assert not joined and s.state == "open" and s.expected == (0, 1) and s.window_s == 2.0
    s2, joined2 = mgr.trigger("j", "cli")
    assert joined2 and s2.session == s.session and s2.joins == 1
    other, joined3 = mgr.trigger("k", "cli", window_s=5.0)
    assert not joined3 and other.session != s.session and other.window_s == 5.0
    assert s.deadline_ns == T0 + int((2.0 + 10.0) * 1e9)


def test_slowdown_trigger_after_the_window_opens_the_next_session(mgr: SessionManager) -> None:
    """A slowdown detected after the open session's window ran is not folded into it (its window
    may have missed it); agents pick the sessions up in order (next_trigger's ``after``)."""
    clock = mgr.clock
    assert isinstance(clock, FakeClock)
    mgr.register(_reg("j", "a", [0, 1], 2))
    s1, _ = mgr.trigger("j", "transient")
    clock.advance_s(3.5)  # window 2 s + join slack 2 s: still joins
    assert mgr.trigger("j", "same burst, late rank")[1]
    clock.advance_s(1.0)  # past window + slack, s1 still collecting uploads
    s2, joined = mgr.trigger("j", "onset")
    assert not joined and s2.session != s1.session
    assert mgr.trigger("j", "onset, another rank")[0].session == s2.session
    t1 = mgr.next_trigger("j")
    assert t1 is not None and t1.session == s1.session
    t2 = mgr.next_trigger("j", after=s1.session)
    assert t2 is not None and t2.session == s2.session and t2.reason == "onset"
    # a hang does not join a slowdown session: it opens a hang session, linked by its reason, that
    # later triggers (slowdown or hang) join
    clock.advance_s(30)
    h, joined_h = mgr.trigger("j", "rank 1 died", kind="hang")
    assert not joined_h and h.session not in (s1.session, s2.session) and h.kind == "hang"
    assert h.reason == f"rank 1 died (during slowdown session {s2.session})"
    assert mgr.trigger("j", "rank 0 died", kind="hang")[0].session == h.session
    assert mgr.trigger("j", "onset, late")[0].session == h.session


def test_expected_ranks_include_unregistered_ranks_below_world_size(mgr: SessionManager) -> None:
    mgr.register(_reg("j", "a", [0, 1], 4))  # the other node's agent never registered
    s, _ = mgr.trigger("j", "x")
    assert s.expected == (0, 1, 2, 3)


def test_registration_during_open_session_grows_expected(mgr: SessionManager) -> None:
    s, _ = mgr.trigger("j", "x")
    assert s.expected == ()
    assert mgr.register(_reg("j", "late", [0, 1], 2)) == [s.session]
    got = mgr.store.get_session(s.session)
    assert got is not None and got.expected == (0, 1)


def test_uploads_are_validated_against_the_session(mgr: SessionManager) -> None:
    mgr.register(_reg("j", "a", [0, 1], 2))
    s, _ = mgr.trigger("j", "x")
    with pytest.raises(RequestError, match="unknown session") as e:
        mgr.accept_patterns(make_pattern_set("j", "nope", 0, 2))
    assert e.value.status == 404
    with pytest.raises(RequestError, match="unknown session .* for job 'other'") as e:
        mgr.accept_patterns(make_pattern_set("other", s.session, 0, 2))
    assert e.value.status == 404 and "'j'" not in str(e.value)  # another job's name is not told
    with pytest.raises(RequestError, match="rank 7 is not registered") as e:
        mgr.accept_patterns(make_pattern_set("j", s.session, 7, 8))
    assert e.value.status == 422
    assert mgr.store.pattern_ranks(s.session) == []


def test_complete_session_is_due_and_closes_once(mgr: SessionManager) -> None:
    mgr.register(_reg("j", "a", [0, 1], 2))
    s, _ = mgr.trigger("j", "x")
    after0 = mgr.accept_patterns(make_pattern_set("j", s.session, 0, 2))
    assert after0.uploaded == (0,) and not mgr.is_complete(after0) and mgr.due() == []
    after1 = mgr.accept_patterns(make_pattern_set("j", s.session, 1, 2, slow=True))
    assert mgr.is_complete(after1)
    assert [d.session for d in mgr.due()] == [s.session]
    assert mgr.begin_localizing(s.session) is not None
    assert mgr.begin_localizing(s.session) is None  # only one caller localizes
    with pytest.raises(RequestError, match="already localizing") as e:
        mgr.accept_patterns(make_pattern_set("j", s.session, 1, 2))
    assert e.value.status == 409
    assert mgr.recover() == [s.session]  # as after a restart mid-localization
    end = mgr.localize_now(s.session)
    assert end is not None
    if HAVE_LOCALIZE:
        assert end.state == "done", end.error
        report = mgr.store.get_report(s.session)
        assert report is not None and report.status == "complete" and report.ranks_missing == ()
        assert set(report.ranks_reported) == {0, 1} and report.trigger_reason == "x"
    else:
        assert end.state == "failed" and "perftracker.localizer.diagnose.localize" in end.error


def test_deadline_gives_partial_report_naming_missing_ranks(mgr: SessionManager) -> None:
    clock = mgr.clock
    assert isinstance(clock, FakeClock)
    mgr.register(_reg("j", "a", [0, 1, 2], 3))
    s, _ = mgr.trigger("j", "x")
    mgr.accept_patterns(make_pattern_set("j", s.session, 0, 3))
    mgr.accept_patterns(make_pattern_set("j", s.session, 2, 3))
    clock.advance_s(11.9)
    assert mgr.due() == []
    clock.advance_s(0.2)
    assert [d.session for d in mgr.due()] == [s.session]
    end = mgr.localize_now(s.session)
    assert end is not None and end.missing == (1,)
    if HAVE_LOCALIZE:
        report = mgr.store.get_report(s.session)
        assert report is not None and report.status == "partial" and report.ranks_missing == (1,)


def test_deadline_with_no_uploads_stores_an_empty_partial_report(mgr: SessionManager) -> None:
    mgr.register(_reg("j", "a", [0, 1], 2))
    s, _ = mgr.trigger("j", "x")
    mgr.clock.advance_s(13)  # type: ignore[attr-defined]
    end = mgr.localize_now(s.session)
    assert end is not None and end.state == "done"
    report = mgr.store.get_report(s.session)
    assert report is not None and report.status == "partial" and report.ranks_missing == (0, 1)
    assert report.ranks_reported == () and "no worker" in report.summary


def _busy(rank: int, session: str, alive: bool = True) -> RankBeat:
    return RankBeat(rank, 40, "steady", 0.1, alive, 10.0, working_on=session)


def test_a_rank_still_being_summarized_keeps_the_session_open_up_to_a_cap(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    mgr = SessionManager(Store(tmp_path / "s.sqlite"), clock,
                         SessionOptions(default_window_s=2.0, collect_grace_s=10.0, busy_extend_s=5.0,
                                        max_collect_s=30.0))
    mgr.register(_reg("j", "a", [0, 1], 2))
    s, _ = mgr.trigger("j", "x")
    mgr.accept_patterns(make_pattern_set("j", s.session, 0, 2))
    # rank 1's agent keeps saying it works on this session: the deadline (12 s) moves on
    for _ in range(8):
        clock.advance_s(2.0)
        mgr.heartbeat(Heartbeat("j", "a", (_busy(1, s.session),)))
        assert mgr.due() == []
    clock.advance_s(2.0)  # 18 s: still past the original deadline, still open
    assert mgr.due() == []
    mgr.accept_patterns(make_pattern_set("j", s.session, 1, 2))
    assert [d.session for d in mgr.due()] == [s.session]  # complete: closes at once
    end = mgr.localize_now(s.session)
    assert end is not None and end.missing == ()
    # a second session: busy forever, but never past opened + window + max_collect_s (32 s)
    s2, _ = mgr.trigger("j", "y")
    mgr.accept_patterns(make_pattern_set("j", s2.session, 0, 2))
    t = 0.0
    while not mgr.due():
        clock.advance_s(1.0)
        t += 1.0
        mgr.heartbeat(Heartbeat("j", "a", (_busy(1, s2.session),)))
        assert t <= 40.0
    assert 31.0 <= t <= 33.0


def test_busy_beats_for_uploaded_ranks_dead_ranks_or_other_sessions_extend_nothing(mgr: SessionManager) -> None:
    mgr.register(_reg("j", "a", [0, 1], 2))
    s, _ = mgr.trigger("j", "x")
    mgr.accept_patterns(make_pattern_set("j", s.session, 0, 2))
    deadline = s.deadline_ns
    mgr.clock.advance_s(8.0)  # type: ignore[attr-defined]
    mgr.heartbeat(Heartbeat("j", "a", (_busy(0, s.session),)))  # rank 0 already uploaded
    mgr.heartbeat(Heartbeat("j", "a", (_busy(1, s.session, alive=False),)))  # a dead rank
    mgr.heartbeat(Heartbeat("j", "a", (_busy(1, "20990101-000000-abcdef"),)))  # unknown session
    mgr.heartbeat(Heartbeat("k", "a", (_busy(1, s.session),)))  # another job
    got = mgr.store.get_session(s.session)
    assert got is not None and got.deadline_ns == deadline


def test_dead_rank_does_not_hold_the_session_open(mgr: SessionManager) -> None:
    mgr.register(_reg("j", "a", [0, 1], 2))
    s, _ = mgr.trigger("j", "x")
    s = mgr.accept_patterns(make_pattern_set("j", s.session, 0, 2))
    assert not mgr.is_complete(s)
    mgr.heartbeat(Heartbeat("j", "a", (RankBeat(1, 40, "steady", 3.0, False, 0.0),)))
    assert mgr.is_complete(s)


def test_long_poll_semantics(mgr: SessionManager) -> None:
    mgr.register(_reg("j", "a", [0], 1))
    assert mgr.next_trigger("j") is None
    s1, _ = mgr.trigger("j", "first")
    t = mgr.next_trigger("j")
    assert t is not None and t.session == s1.session and t.reason == "first" and t.kind == "slowdown"
    assert mgr.next_trigger("j", after=s1.session) is None  # already seen
    mgr.accept_patterns(make_pattern_set("j", s1.session, 0, 1))
    mgr.localize_now(s1.session)
    assert mgr.next_trigger("j") is None  # closed sessions are not handed out
    s2, joined = mgr.trigger("j", "second")
    assert not joined
    t2 = mgr.next_trigger("j", after=s1.session)
    assert t2 is not None and t2.session == s2.session
    assert mgr.next_trigger("other-job") is None


def test_hang_snapshot_opens_hang_session_and_converts_a_slowdown_session(mgr: SessionManager) -> None:
    mgr.register(_reg("j", "a", [0, 1], 2))
    snap = HangSnapshot("j", 0, 2, "h", 100, T0, 41, 30.0, (Frame("train.py", 88, "step"),), current_op="allreduce")
    s = mgr.accept_hang_snapshot(snap)
    assert s.kind == "hang" and s.uploaded == (0,) and s.deadline_ns == T0 + 5 * 10**9
    assert mgr.next_trigger("j") is not None and mgr.next_trigger("j").kind == "hang"  # type: ignore[union-attr]

    mgr.register(_reg("k", "b", [0, 1], 2))
    slow, _ = mgr.trigger("k", "slowdown")
    conv = mgr.accept_hang_snapshot(HangSnapshot("k", 1, 2, "h", 101, T0, 41, 30.0, (), session=slow.session))
    assert conv.session == slow.session and conv.kind == "hang" and conv.deadline_ns == T0 + 5 * 10**9


def test_hang_session_reaches_the_hang_seam_with_liveness(mgr: SessionManager) -> None:
    mgr.register(_reg("j", "a", [0, 1, 2], 3))
    snap = HangSnapshot("j", 0, 2, "h", 100, T0, 41, 30.0, (Frame("dist.py", 10, "all_reduce"),),
                        current_op="c10d::allreduce_")
    s = mgr.accept_hang_snapshot(snap)
    mgr.heartbeat(Heartbeat("j", "a", (RankBeat(1, 41, "blocked", 30.0, False, 0.0),)))  # rank 1 died
    s = mgr.store.get_session(s.session)  # type: ignore[assignment]
    assert s is not None and not mgr.is_complete(s)  # rank 2 is alive and may still send
    mgr.clock.advance_s(6)  # type: ignore[attr-defined]
    assert [d.session for d in mgr.due()] == [s.session]
    end = mgr.localize_now(s.session)
    assert end is not None
    if HAVE_HANG:
        assert end.state == "done", end.error
        report = mgr.store.get_report(s.session)
        assert report is not None and report.kind == "hang" and report.session == s.session
        states = {st.rank: st for st in report.hang_states}
        assert states[1].detail == "process dead" and states[2].state == "silent"
        assert "no heartbeat" in states[2].detail
    else:
        assert end.state == "failed" and "perftracker.localizer.diagnose.incidents.hang" in end.error
