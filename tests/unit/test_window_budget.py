"""The window cost budget's arithmetic (perftracker/runtime/window/budget.py, issue 30): the sliding
hour, spending, refusing automatic windows near the limit and not below it, manual windows
counted but never refused, the online loss estimate, and the allowance that accrues with training
time (2 % of the training time in the trailing hour, an initial advance for the first window).

Budgets built with ``started_s=-HOUR`` have trained a whole hour already: the full 72 s."""

from __future__ import annotations

import pytest

from perftracker.runtime.window.budget import CostBudget, lost_s, median

HOUR = 3600.0


def test_lost_is_wall_time_minus_the_iterations_at_the_baseline() -> None:
    # 30 s of wall time, 250 iterations at a 100 ms baseline: 5 s lost
    assert lost_s(30.0, 250, 0.1) == pytest.approx(5.0)
    assert lost_s(25.0, 250, 0.1) == pytest.approx(0.0)
    assert lost_s(24.0, 250, 0.1) == pytest.approx(-1.0)  # faster than before: kept for averaging
    assert median([0.1, 0.3, 0.2, float("nan"), -1.0]) == pytest.approx(0.2)
    assert median([]) == 0.0


def test_default_is_two_percent_of_an_hour() -> None:
    b = CostBudget(started_s=-HOUR)
    assert b.limit_s == pytest.approx(72.0) and b.left_s(0.0) == pytest.approx(72.0)


def test_spend_then_refuse_near_the_limit_and_not_below() -> None:
    b = CostBudget(fraction=0.02, horizon_s=3600.0, started_s=-HOUR)
    b.spend(100.0, 30.0, manual=False)
    assert b.left_s(100.0) == pytest.approx(42.0) and b.expected_s(100.0) == pytest.approx(30.0)
    assert b.ask(200.0, manual=False)  # 30 expected <= 42 left
    b.spend(200.0, 30.0, manual=False)
    assert b.left_s(200.0) == pytest.approx(12.0)
    assert not b.ask(300.0, manual=False) and b.refused == 1  # 30 expected > 12 left
    b2 = CostBudget(started_s=-HOUR)
    b2.spend(0.0, 36.0, manual=False)
    assert b2.ask(1.0, manual=False)  # exactly at the limit: 36 expected, 36 left
    b2.spend(1.0, 0.01, manual=False)
    assert not b2.ask(2.0, manual=False)  # 36 expected > 35.99 left


def test_the_hour_slides() -> None:
    b = CostBudget(started_s=-HOUR)
    b.spend(0.0, 60.0, manual=False)
    assert not b.ask(3599.0, manual=False)  # still within the hour: 60 > 12 left
    assert b.spent_s(3600.0) == 0.0 and b.ask(3600.0, manual=False)  # an hour later it has expired
    assert b.expected_s(3600.0) == pytest.approx(b.first_guess_s)


def test_manual_windows_are_never_refused_but_counted() -> None:
    b = CostBudget(started_s=-HOUR)
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
    tight = CostBudget(fraction=0.001, horizon_s=3600.0, first_guess_s=5.0, initial_s=0.0, started_s=-HOUR)  # 3.6 s
    assert not tight.ask(0.0, manual=False)
    assert CostBudget(fraction=0.002, first_guess_s=5.0, initial_s=0.0, started_s=-HOUR).ask(0.0, manual=False)  # 7.2 s


# ---------------------------------------------------------------- the allowance accrues with training


def test_the_allowance_is_two_percent_of_the_training_so_far_and_the_initial_advance_before_that() -> None:
    b = CostBudget(started_s=1000.0, initial_s=10.0)
    assert b.trained_s(1000.0 + 15.0) == pytest.approx(15.0)
    assert b.allowance_s(1015.0) == pytest.approx(10.0)  # 2 % of 15 s is 0.3 s: the advance
    assert b.allowance_s(1000.0 + 1000.0) == pytest.approx(20.0)  # 2 % of 1000 s
    assert b.allowance_s(1000.0 + 5 * HOUR) == pytest.approx(72.0)  # the trailing hour only
    assert CostBudget(initial_s=0.0).allowance_s(50.0) == 0.0  # start unknown: nothing has accrued
    d = b.to_dict(2000.0)
    assert d["allowance_s"] == pytest.approx(20.0) and d["trained_s"] == pytest.approx(1000.0) and d["initial_s"] == 10.0


@pytest.mark.parametrize("factor, allowed", [(0.9, False), (1.1, True)])
def test_a_second_automatic_window_waits_until_two_percent_of_training_pays_for_both(factor: float,
                                                                                   allowed: bool) -> None:
    # a first window at 10 s of training cost 8 s (within the 10 s advance); the next is expected to
    # cost 8 s too, so it fits once 2 % of the training covers 16 s: at 800 s of training
    b = CostBudget(started_s=0.0, initial_s=10.0)
    assert b.ask(10.0, manual=False)
    b.spend(12.0, 8.0, manual=False)
    boundary_s = (8.0 + 8.0) / 0.02
    assert b.ask(factor * boundary_s, manual=False) is allowed
    assert b.refused == (0 if allowed else 1)


@pytest.mark.parametrize("factor, allowed", [(0.9, False), (1.1, True)])
def test_no_advance_the_first_window_waits_for_its_expected_cost_to_accrue(factor: float, allowed: bool) -> None:
    b = CostBudget(started_s=100.0, initial_s=0.0, first_guess_s=5.0)
    boundary_s = 5.0 / 0.02  # 250 s of training
    assert b.ask(100.0 + factor * boundary_s, manual=False) is allowed


@pytest.mark.parametrize("factor, allowed", [(0.9, True), (1.1, False)])
def test_the_first_window_is_allowed_when_its_expected_cost_fits_the_advance(factor: float, allowed: bool) -> None:
    # at 5 s of training only the advance counts: a first guess of 0.9x the advance fits, 1.1x not
    b = CostBudget(started_s=0.0, initial_s=10.0, first_guess_s=factor * 10.0)
    assert b.ask(5.0, manual=False) is allowed


def test_manual_windows_spend_the_accrued_budget_and_are_never_refused() -> None:
    b = CostBudget(started_s=0.0, initial_s=10.0)
    b.spend(20.0, 15.0, manual=True, session="m")  # a manual window overspent the advance
    assert b.ask(30.0, manual=True) and b.refused == 0
    assert not b.ask(30.0, manual=False) and b.refused == 1
    assert b.ask((15.0 + 15.0) / 0.02 * 1.1, manual=False)  # paid back by 1650 s of training
