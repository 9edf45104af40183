"""The first look at the localizer (issue 30): heartbeats carry each rank's per-step phase times;
a detector's slowdown whose rank and phase they name closes at once with a "first look" report and
no agent sees it open; every other case opens the session for a window. Fake clock, real sqlite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from perftracker.localizer.service.session.manager import SessionManager, SessionOptions
from perftracker.localizer.service.validate import (
    Heartbeat,
    RankBeat,
    Registration,
    RequestError,
    WorkerInfo,
    parse_heartbeat,
)
from perftracker.localizer.store.sqlite_store import Store

from perftracker.clock import FakeClock

T0 = 1_700_000_000 * 10**9
DETECTOR = "rank 1: slowdown at iteration 300 (+40% over 100.0 ms)"


def _mgr(tmp_path: Path, first_look: bool = True) -> SessionManager:
    m = SessionManager(Store(tmp_path / "s.sqlite"), FakeClock(T0),
                       SessionOptions(default_window_s=2.0, collect_grace_s=10.0, first_look=first_look))
    m.register(Registration("j", "a", "h", tuple(WorkerInfo(r, r, 4, 100 + r, 100 + r, "h") for r in range(4))))
    return m


def _rows(seed: int, data: float = 5.0, step: float = 10.0, rest: float = 85.0) -> tuple[tuple[float, ...], ...]:
    rng = np.random.default_rng(seed)
    arr = np.array([data, step, rest]) * rng.normal(1.0, 0.03, size=(20, 3))
    return tuple(tuple(float(x) for x in r) for r in arr)


def _beat(mgr: SessionManager, slow_rank: int | None, extra_ms: float = 40.0, ranks: range = range(4)) -> None:
    beats = []
    for r in ranks:
        rows = _rows(r, data=5.0 + (extra_ms if r == slow_rank else 0.0),
                     rest=85.0 + (extra_ms if slow_rank is not None and r != slow_rank else 0.0))
        beats.append(RankBeat(r, 300, "watching", 0.01, True, 140.0, phases_ms=rows))
    mgr.heartbeat(Heartbeat("j", "a", tuple(beats)))


def test_a_rank_slow_in_data_loading_is_settled_without_a_window(tmp_path: Path) -> None:
    mgr = _mgr(tmp_path)
    _beat(mgr, slow_rank=2)
    s, joined = mgr.trigger("j", DETECTOR)
    assert not joined and s.state == "done"
    assert mgr.next_trigger("j") is None  # no agent starts a window for it
    rep = mgr.store.events.get_report(s.session)
    assert rep is not None and rep.level == "first look" and rep.window_s == 0.0
    assert [f.ranks for f in rep.findings] == [(2,)] and rep.findings[0].label == "data loading"
    assert rep.headline.startswith("rank 2: data loading") and len(rep.headline) <= 120


@pytest.mark.parametrize("case", ["no outlier", "manual trigger", "option off", "a rank not heard", "stale"])
def test_otherwise_the_session_opens_for_a_window(tmp_path: Path, case: str) -> None:
    mgr = _mgr(tmp_path, first_look=case != "option off")
    _beat(mgr, slow_rank=None if case == "no outlier" else 2, ranks=range(3) if case == "a rank not heard" else range(4))
    if case == "stale":
        assert isinstance(mgr.clock, FakeClock)
        mgr.clock.advance_s(31.0)
    s, _ = mgr.trigger("j", "cli" if case == "manual trigger" else DETECTOR)
    assert s.state == "open"
    trig = mgr.next_trigger("j")
    assert trig is not None and trig.session == s.session


def test_near_the_bar(tmp_path: Path) -> None:
    """The bar is 10 % of the step; the step is 100 ms plus the excess (the peers wait it out)."""
    below = _mgr(tmp_path / "below")
    _beat(below, slow_rank=3, extra_ms=0.09 * 100 / 0.91)
    assert below.trigger("j", DETECTOR)[0].state == "open"
    above = _mgr(tmp_path / "above")
    _beat(above, slow_rank=3, extra_ms=0.11 * 100 / 0.89)
    assert above.trigger("j", DETECTOR)[0].state == "done"


def test_heartbeat_phase_rows_are_checked() -> None:
    good = {"job": "j", "agent_id": "a", "ranks": [{"rank": 0, "phases_ms": [[1.0, 2.0, 3.0]] * 20}]}
    assert parse_heartbeat(good).ranks[0].phases_ms[0] == (1.0, 2.0, 3.0)
    for bad in ([[1.0, 2.0]], [[1.0, 2.0, float("nan")]], [[1.0, -2.0, 3.0]], [[1.0, 2.0, 3.0]] * 65, "x"):
        with pytest.raises(RequestError):
            parse_heartbeat({**good, "ranks": [{"rank": 0, "phases_ms": bad}]})
