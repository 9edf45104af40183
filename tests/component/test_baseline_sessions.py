"""The healthy baseline per job at the localizer (issue 49): when its window opens, what is kept, a
restart under the same job name, the comparison in a later report, retaking it. Fake clock, real sqlite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from perftracker.localizer.diagnose.verdict.since_fast import NO_BASELINE
from perftracker.localizer.service.session.baseline import BASELINE_REASON, BaselineOptions
from perftracker.localizer.service.session.manager import SessionManager, SessionOptions
from perftracker.localizer.service.validate import Heartbeat, RankBeat, Registration, WorkerInfo
from perftracker.localizer.store.sqlite_store import Store

from perftracker.clock import FakeClock
from perftracker.model import Category, Pattern, PatternSet, Report

T0 = 1_700_000_000 * 10**9
STEP = {"forward": 40.0, "backward": 30.0, "gloo:all_reduce": 15.0, "train.py:50 in collate_fn": 4.0,
        "aten::add_": 6.0, "train.py:80 in main": 5.0}
CATS = {"forward": Category.COMPUTE, "backward": Category.COMPUTE, "gloo:all_reduce": Category.COLLECTIVE,
        "aten::add_": Category.COMPUTE}
ON = BaselineOptions(enabled=True, window_s=3.0, min_iterations=50, steady_beats=3, steady_spread=0.15)


def _mgr(path: Path, options: BaselineOptions = ON, clock: FakeClock | None = None) -> SessionManager:
    m = SessionManager(Store(path), clock or FakeClock(T0), SessionOptions(default_window_s=2.0, collect_grace_s=10.0))
    m.baseline.options = options
    m.register(Registration("j", "a", "h", tuple(WorkerInfo(r, r, 4, 100 + r, 100 + r, f"h{r}") for r in range(4))))
    return m


def _beat(m: SessionManager, iteration: int, ms: float, ranks: range = range(4)) -> None:
    m.heartbeat(Heartbeat("j", "a", tuple(RankBeat(r, iteration, "watching", 0.01, True, ms) for r in ranks)))
    assert isinstance(m.clock, FakeClock)
    m.clock.advance_s(2.0)


def _sets(session: str, seed: int, extra_ms: dict[str, float] | None = None) -> list[PatternSet]:
    rng = np.random.default_rng(seed)
    out = []
    for r in range(4):
        t = {k: v + (extra_ms or {}).get(k, 0.0) for k, v in STEP.items()}
        total = sum(t.values())
        pats = tuple(Pattern(k, CATS.get(k, Category.PYTHON), float(np.clip(v / total + rng.normal(0, 0.005), 0, 1)),
                             float(np.clip(0.8 + rng.normal(0, 0.02), 0, 1)), 0.05, label=k.rsplit(" in ", 1)[-1],
                             executions=100, critical_ns=10**8, resource="cpu") for k, v in t.items())
        out.append(PatternSet(job="j", session=session, rank=r, world_size=4, host=f"h{r}",
                              window_start_ns=T0, window_end_ns=T0 + 3 * 10**9, patterns=pats,
                              iteration_ms=(total,) * 6))
    return out


def _localize(m: SessionManager, session: str, sets: list[PatternSet]) -> Report:
    for ps in sets:
        m.accept_patterns(ps)
    assert m.localize_now(session) is not None
    rep = m.store.events.get_report(session)
    assert rep is not None
    return rep


def _take(m: SessionManager) -> str:
    for it in (60, 80, 100):
        _beat(m, it, 100.0)
    trig = m.next_trigger("j")
    assert trig is not None and trig.reason == BASELINE_REASON and trig.window_s == 3.0
    return trig.session


def test_the_window_opens_once_every_rank_runs_steadily(tmp_path: Path) -> None:
    m = _mgr(tmp_path / "s.sqlite")
    _beat(m, 40, 100.0)  # learning: not yet
    _beat(m, 60, 100.0, ranks=range(3))  # a rank not heard: not yet
    _beat(m, 60, 100.0)
    _beat(m, 80, 140.0)  # not steady: 100 -> 140 ms
    _beat(m, 100, 100.0)
    assert m.next_trigger("j") is None
    _beat(m, 120, 104.0)
    _beat(m, 140, 98.0)  # 140, 100, 104, 98: the last three within 15 %
    trig = m.next_trigger("j")
    assert trig is not None and trig.reason == BASELINE_REASON
    _beat(m, 160, 100.0)
    assert m.store.open_count("j") == 1  # one baseline window, not one per heartbeat


def test_off_by_default(tmp_path: Path) -> None:
    m = _mgr(tmp_path / "s.sqlite", options=BaselineOptions())
    assert not m.baseline.options.enabled
    for it in range(60, 200, 20):
        _beat(m, it, 100.0)
    assert m.next_trigger("j") is None


def test_the_baseline_is_kept_across_a_restart_and_names_what_grew(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    m = _mgr(path)
    session = _take(m)
    rep = _localize(m, session, _sets(session, seed=1))
    assert rep.since_fast is not None and rep.since_fast.baseline_session == session
    assert rep.since_fast.note.startswith("this window is the job's baseline")
    info = m.store.baselines.info("j")
    assert [(i.session, i.ranks) for i in info] == [(session, 4)] and info[0].bytes < 4 * 4096
    m.store.close()

    clock = FakeClock(T0 + 3600 * 10**9)  # an hour later, the job restarted under the same name
    m2 = _mgr(path, clock=clock)
    for it in (60, 80, 100, 120):
        _beat(m2, it, 140.0)
    assert m2.next_trigger("j") is None  # it keeps its baseline: no second window
    s, _ = m2.trigger("j", "rank 0: slowdown at iteration 300 (+40% over 100.0 ms)")
    # a library upgrade slowed one CPU op on every rank: compute is never outside its expected range
    rep = _localize(m2, s.session, _sets(s.session, seed=2, extra_ms={"aten::add_": 40.0}))
    assert len(rep.findings) == 1
    f = rep.findings[0]
    assert f.tests == ("baseline",) and f.label == "aten::add_" and f.ranks == (0, 1, 2, 3)
    assert rep.headline.startswith("every rank spends 3") and "against 6" in rep.headline and "1.0 h ago" in rep.headline
    assert rep.since_fast is not None and rep.since_fast.step_ms_then == 100.0 and rep.since_fast.step_ms_now == 140.0
    back = Report.from_dict(rep.to_dict())
    assert back.since_fast == rep.since_fast
    # a Python function past its fixed range is found by it; the baseline adds its then and now
    s, _ = m2.trigger("j", "on-demand (perftracker trigger)")
    rep = _localize(m2, s.session, _sets(s.session, seed=3, extra_ms={"train.py:50 in collate_fn": 40.0}))
    f = rep.findings[0]
    assert f.label == "collate_fn" and "baseline" not in f.tests
    assert any(e.startswith("since it was fast: 3.8% at the baseline") and "31% now" in e for e in f.evidence)


def test_an_unchanged_job_gets_no_baseline_finding(tmp_path: Path) -> None:
    m = _mgr(tmp_path / "s.sqlite")
    session = _take(m)
    _localize(m, session, _sets(session, seed=3))
    s, _ = m.trigger("j", "on-demand (perftracker trigger)")
    rep = _localize(m, s.session, _sets(s.session, seed=4))
    assert not any(f.tests == ("baseline",) for f in rep.findings)
    assert rep.since_fast is not None and rep.since_fast.note.startswith("no function's share grew")


def test_without_a_baseline_the_report_says_so(tmp_path: Path) -> None:
    m = _mgr(tmp_path / "s.sqlite", options=BaselineOptions())
    s, _ = m.trigger("j", "on-demand (perftracker trigger)")
    rep = _localize(m, s.session, _sets(s.session, seed=5, extra_ms={"train.py:50 in collate_fn": 40.0}))
    assert rep.since_fast is not None and rep.since_fast.note == NO_BASELINE


def test_a_manual_baseline_and_a_retake(tmp_path: Path) -> None:
    m = _mgr(tmp_path / "s.sqlite", options=BaselineOptions())  # off: taken by hand
    s, _ = m.trigger("j", BASELINE_REASON)
    _localize(m, s.session, _sets(s.session, seed=6))
    assert [i.session for i in m.store.baselines.info("j")] == [s.session]
    m.baseline.options = ON
    assert m.baseline.retake("j") == 4 and m.store.baselines.info("j") == []
    assert _take(m) != s.session  # the next steady period is the new one


def test_a_window_a_slowdown_joined_is_not_kept(tmp_path: Path) -> None:
    m = _mgr(tmp_path / "s.sqlite")
    session = _take(m)
    s, joined = m.trigger("j", "rank 2: slowdown at iteration 120 (+30% over 100.0 ms)")
    assert joined and s.session == session
    rep = _localize(m, session, _sets(session, seed=7))
    assert m.store.baselines.info("j") == []
    assert rep.since_fast is not None and rep.since_fast.note.startswith("not kept as the job's baseline")
    for it in (200, 220, 240):
        _beat(m, it, 100.0)
    trig = m.next_trigger("j", after=session)
    assert trig is not None and trig.reason == BASELINE_REASON  # tried again


def test_the_next_report_says_whether_the_fix_paid(tmp_path: Path) -> None:
    m = _mgr(tmp_path / "s.sqlite")
    session = _take(m)
    _localize(m, session, _sets(session, seed=8))
    s, _ = m.trigger("j", "rank 0: slowdown at iteration 300 (+40% over 100.0 ms)")
    slow = _localize(m, s.session, _sets(s.session, seed=9, extra_ms={"aten::add_": 40.0}))
    assert slow.findings[0].saves_share > 0.2 and slow.since_fast is not None and slow.since_fast.paid == ""
    assert isinstance(m.clock, FakeClock)
    m.clock.advance_s(600.0)
    s2, _ = m.trigger("j", "on-demand (perftracker trigger)")  # the op restored: back to 100 ms steps
    fixed = _localize(m, s2.session, _sets(s2.session, seed=10))
    assert fixed.since_fast is not None
    assert fixed.since_fast.paid.startswith(f"the previous report (session {s.session}, 10 min ago) predicted that "
                                            f"fixing aten::add_ would save {round(100 * slow.findings[0].saves_share)}%")
    assert fixed.since_fast.paid.endswith("the step went from 140.0 ms to 100.0 ms, 29% less")
    assert Report.from_dict(fixed.to_dict()).since_fast == fixed.since_fast
