"""The window cost budget's arithmetic (perftracker/runtime/window_budget.py, issue 30): the sliding
hour, spending, refusing automatic windows near the limit and not below it, manual windows
counted but never refused, and the online loss estimate."""

from __future__ import annotations

import pytest

from perftracker.runtime.window_budget import CostBudget, lost_s, median


def test_lost_is_wall_time_minus_the_iterations_at_the_baseline() -> None:
    # 30 s of wall time, 250 iterations at a 100 ms baseline: 5 s lost
    assert lost_s(30.0, 250, 0.1) == pytest.approx(5.0)
    assert lost_s(25.0, 250, 0.1) == pytest.approx(0.0)
    assert lost_s(24.0, 250, 0.1) == pytest.approx(-1.0)  # faster than before: kept for averaging
    assert median([0.1, 0.3, 0.2, float("nan"), -1.0]) == pytest.approx(0.2)
    assert median([]) == 0.0


def test_default_is_two_percent_of_an_hour() -> None:
    b = CostBudget()
    assert b.limit_s == pytest.approx(72.0) and b.left_s(0.0) == pytest.approx(72.0)


def test_spend_then_refuse_near_the_limit_and_not_below() -> None:
    b = CostBudget(fraction=0.02, horizon_s=3600.0)
    b.spend(100.0, 30.0, manual=False)
    assert b.left_s(100.0) == pytest.approx(42.0) and b.expected_s(100.0) == pytest.approx(30.0)
    assert b.ask(200.0, manual=False)  # 30 expected <= 42 left
    b.spend(200.0, 30.0, manual=False)
    assert b.left_s(200.0) == pytest.approx(12.0)
    assert not b.ask(300.0, manual=False) and b.refused == 1  # 30 expected > 12 left
    b2 = CostBudget()
    b2.spend(0.0, 36.0, manual=False)
    assert b2.ask(1.0, manual=False)  # exactly at the limit: 36 expected, 36 left
    b2.spend(1.0, 0.01, manual=False)
    assert not b2.ask(2.0, manual=False)  # 36 expected > 35.99 left


def test_the_hour_slides() -> None:
    b = CostBudget()
    b.spend(0.0, 60.0, manual=False)
    assert not b.ask(3599.0, manual=False)  # still within the hour: 60 > 12 left
    assert b.spent_s(3600.0) == 0.0 and b.ask(3600.0, manual=False)  # an hour later it has expired
    assert b.expected_s(3600.0) == pytest.approx(b.first_guess_s)


def test_manual_windows_are_never_refused_but_counted() -> None:
    b = CostBudget()
    b.spend(10.0, 80.0, manual=True, session="m1")
    assert b.left_s(10.0) == 0.0
    assert b.ask(20.0, manual=True) and b.refused == 0
    assert not b.ask(20.0, manual=False) and b.refused == 1
    d = b.to_dict(20.0)
    assert d["manual_windows"] == 1 and d["windows"] == 1 and d["spent_s"] == pytest.approx(80.0)
    assert d["last_window_session"] == "m1" and d["refused"] == 1


def test_a_negative_estimate_spends_nothing_and_the_first_guess_gates_the_first_window() -> None:
    b = CostBudget(first_guess_s=5.0)
    b.spend(0.0, -3.0, manual=False)
    assert b.spent_s(0.0) == 0.0
    tight = CostBudget(fraction=0.001, horizon_s=3600.0, first_guess_s=5.0)  # 3.6 s a hour
    assert not tight.ask(0.0, manual=False)
    assert CostBudget(fraction=0.002, first_guess_s=5.0).ask(0.0, manual=False)  # 7.2 s
