"""The online window-cost meter (perftracker/runtime/window/cost.py, issue 30) with a fake clock and
iteration counter: the loss from iteration times before/during/after, the ledger, the gate on the
detector's triggers (manual ones counted, never refused), and `perftracker status` reading it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from perftracker.cli import status
from perftracker.runtime.window.budget import CostBudget
from perftracker.runtime.window.cost import WindowCostMeter, ledger_path


class FakeRuntime:
    def __init__(self) -> None:
        self.iteration = 1000
        self.recent = [100.0] * 50  # ms
        self.started_s: float | None = 10_000.0 - 3600.0  # trained an hour: the whole 72 s
        self.boundary_s: float | None = None

    def training_started_s(self) -> float | None:
        return self.started_s

    def last_boundary_s(self) -> float | None:
        return self.boundary_s

    def recent_iteration_ms(self) -> list[float]:
        return list(self.recent)


class Clock:
    def __init__(self) -> None:
        self.t = 10_000.0

    def __call__(self) -> float:
        return self.t


def _meter(tmp_path: Path, fraction: float = 0.02) -> tuple[WindowCostMeter, FakeRuntime, Clock, Path]:
    rt, clock = FakeRuntime(), Clock()
    ledger = ledger_path(tmp_path, "job/x", 3)
    return WindowCostMeter(rt, ledger, CostBudget(fraction=fraction), clock=clock), rt, clock, ledger


def test_a_window_costs_wall_time_minus_iterations_at_the_median_before(tmp_path: Path) -> None:
    m, rt, clock, ledger = _meter(tmp_path)
    m.armed("s1", "slowdown")
    clock.t += 40.0  # 40 s from arm to the end of the after-phase ...
    rt.iteration += 300  # ... in which 300 iterations at 100 ms would have taken 30 s: 10 s lost
    cost = m.measure("s1")
    assert cost is not None and cost["lost_s"] == pytest.approx(10.0) and not cost["manual"]
    assert ledger.name == "job_x-rank3.json"
    data = json.loads(ledger.read_text())
    assert data["budget"]["spent_s"] == pytest.approx(10.0) and data["budget"]["left_s"] == pytest.approx(62.0)
    assert data["windows"][0]["session"] == "s1"
    assert m.measure("s1") is None  # measured once


def test_a_window_that_cost_nothing_spends_nothing(tmp_path: Path) -> None:
    m, rt, clock, _ = _meter(tmp_path)
    m.armed("s1", "slowdown")
    clock.t += 30.0
    rt.iteration += 300  # exactly the baseline speed
    assert m.measure("s1")["lost_s"] == pytest.approx(0.0)  # type: ignore[index]
    assert m.budget.spent_s(clock.t) == 0.0


def test_the_detectors_triggers_are_refused_once_the_budget_is_spent_manual_ones_never(tmp_path: Path) -> None:
    m, rt, clock, ledger = _meter(tmp_path, fraction=0.01)  # 36 s an hour
    assert m.allows_trigger("slowdown")  # first guess 5 s fits
    m.armed("s1", "on-demand")  # a manual window that cost 30 s
    clock.t += 60.0
    rt.iteration += 300
    assert m.measure("s1")["manual"] is True  # type: ignore[index]
    assert not m.allows_trigger("slowdown")  # expected 30 s > 6 s left
    assert m.allows_trigger("on-demand")  # manual: never refused
    assert json.loads(ledger.read_text())["budget"]["refused"] == 1
    clock.t += 3600.0  # an hour later the spend has expired
    assert m.allows_trigger("slowdown")


def test_perftracker_status_shows_cost_and_budget_left(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m, rt, clock, _ = _meter(tmp_path)
    m.armed("sess-a", "slowdown")
    clock.t += 40.0
    rt.iteration += 300
    m.measure("sess-a")
    (tmp_path / "budget" / "bad.json").write_text("{not json")  # one bad file: a warning, the rest shown
    assert status.run(argparse.Namespace(run_dir=str(tmp_path), format="text")) == 0
    out, err = capsys.readouterr()
    assert "job_x-rank3: 1 window(s) in the last hour (0 manual), last cost 10.00 s (sess-a)" in out
    assert "spent 10.00 s of 72.00 s allowed (2 % of 3600 s trained, initial 10 s), left 62.00 s, refused 0" in out
    assert "bad.json" in err and "skipped" in err


def test_the_budget_accrues_from_the_runtimes_first_event(tmp_path: Path) -> None:
    m, rt, clock, ledger = _meter(tmp_path)
    rt.started_s = clock.t - 15.0  # a job 15 s into training: only the 10 s advance
    assert m.allows_trigger("slowdown")  # the first guess (5 s) fits
    m.armed("s1", "slowdown")
    clock.t += 30.0
    rt.iteration += 200  # 20 s at the baseline in 30 s: 10 s lost
    m.measure("s1")
    assert not m.allows_trigger("slowdown")  # 10 s spent of the 10 s advance
    budget = json.loads(ledger.read_text())["budget"]
    assert budget["allowance_s"] == pytest.approx(10.0) and budget["refused"] == 1
    clock.t = rt.started_s + 0.9 * (10.0 + 10.0) / 0.02  # 2 % of 900 s = 18 s < 10 spent + 10 expected
    assert not m.allows_trigger("slowdown")
    clock.t = rt.started_s + 1.1 * (10.0 + 10.0) / 0.02  # 2 % of 1100 s = 22 s
    assert m.allows_trigger("slowdown")
    assert m.allows_trigger("on-demand")


def test_a_window_whose_process_ends_is_measured_at_exit_partial(tmp_path: Path) -> None:
    m, rt, clock, ledger = _meter(tmp_path)
    m.armed("s1", "slowdown")  # delivered, but the 5 s timer never fires: the process ends first
    clock.t += 12.0
    rt.iteration += 80  # 8 s at the 100 ms baseline ...
    rt.boundary_s = clock.t - 2.0  # ... by the last iteration, 10 s after the arm; then 2 s of exit
    got = m.finish_at_exit()
    assert len(got) == 1 and got[0]["partial"] is True
    assert got[0]["lost_s"] == pytest.approx(2.0) and got[0]["measured_s"] == pytest.approx(10.0)
    data = json.loads(ledger.read_text())
    assert data["windows"][0]["partial"] is True and data["budget"]["spent_s"] == pytest.approx(2.0)
    assert m.finish_at_exit() == []  # measured once
    # a window already measured after its after-phase is not measured again at exit
    m.armed("s2", "slowdown")
    clock.t += 10.0
    rt.iteration += 100
    assert m.measure("s2") is not None and m.finish_at_exit() == []


def test_status_labels_a_cost_measured_at_exit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m, rt, clock, _ = _meter(tmp_path)
    m.armed("sess-x", "on-demand")
    clock.t += 10.0
    rt.iteration += 50
    rt.boundary_s = clock.t
    m.finish_at_exit()
    assert status.run(argparse.Namespace(run_dir=str(tmp_path), format="text")) == 0
    out = capsys.readouterr().out
    assert "last cost 5.00 s partial (to the exit) (sess-x)" in out and "(1 manual)" in out


def test_a_session_the_detector_opened_counts_as_automatic_a_manual_one_as_manual(tmp_path: Path) -> None:
    # the agent's START_WINDOW carries its description of the trigger that opened the session
    from perftracker.agent.daemon.localizer_link import describe_trigger

    from perftracker.runtime.window.cost import is_manual

    detector = describe_trigger(0, "slowdown", {"iteration": 472, "ratio": 1.47, "baseline_ms": 31.8})
    assert detector == "rank 0: slowdown at iteration 472 (+47% over 31.8 ms)"
    assert not is_manual(detector) and not is_manual("slowdown") and not is_manual(describe_trigger(3, "slowdown", {}))
    for manual in ("on-demand (perftracker trigger)", "test", "demo: on demand", "slowdown test by hand", ""):
        assert is_manual(manual), manual
    m, rt, clock, ledger = _meter(tmp_path)
    m.armed("s1", detector)
    clock.t += 30.0
    rt.iteration += 300
    m.measure("s1")
    assert json.loads(ledger.read_text())["budget"]["manual_windows"] == 0
