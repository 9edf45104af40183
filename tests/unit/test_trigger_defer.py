"""A detector's trigger held until its slowdown is worth a window (issue 30): window_budget.worth_window
and trigger_defer.TriggerDeferral. Found and not found, near the bars."""

from __future__ import annotations

import math

import pytest

from perftracker.runtime.trigger.defer import TriggerDeferral, slow_levels
from perftracker.runtime.window.budget import CostBudget, worth_window

DETAIL = {"test": "cusum", "ratio": 1.25, "baseline_ms": 20.0, "recent_ms": 25.0, "noise": 0.2}


def test_worth_a_window_near_the_bar() -> None:
    # 1.2x takes 1/6 of the time: 30 s of training make 5 s, the window's cost
    assert worth_window(1.2, 30.1, 5.0) and not worth_window(1.2, 29.5, 5.0)
    assert not worth_window(1.2, 8.0, 5.0)  # the clean hf_job's blip: 1.3 s against a 5 s window
    assert worth_window(2.0, 10.0, 5.0) and not worth_window(2.0, 9.9, 5.0)
    for not_a_slowdown in (1.0, 0.8, math.nan):
        assert worth_window(not_a_slowdown, 0.0, 5.0)


def test_the_budget_weighs_its_expected_cost_and_the_jobs_age() -> None:
    b = CostBudget(started_s=100.0)
    assert not b.worth(110.0, 1.5)  # 10 s trained: 3.3 s < 5 s (first guess)
    assert b.worth(116.0, 1.5)  # 16 s: 5.3 s
    b.spend(116.0, 9.0, manual=False)  # a measured window of 9 s: the next must be worth 9 s
    assert not b.worth(120.0, 1.5) and b.worth(128.0, 1.5)
    hour = CostBudget(started_s=0.0)
    assert hour.worth(7200.0, 1.01)  # an hour of training: 1 % of it is 36 s


def test_a_held_trigger_goes_out_once_worth_it_if_the_job_is_still_slow() -> None:
    d = TriggerDeferral()
    assert d.hold("slowdown", DETAIL, now_s=10.0)
    worth = {"now": False}
    assert d.check(12.0, [25.0] * 20, lambda r: worth["now"]) is None and d.held is not None
    worth["now"] = True
    reason, detail = d.check(30.0, [24.0] * 20, lambda r: worth["now"])  # type: ignore[misc]
    assert reason == "slowdown" and detail["deferred_s"] == 20.0 and detail["ratio_when_sent"] == pytest.approx(1.2)
    assert detail["baseline_ms"] == 20.0 and d.held is None and d.sent_late == 1


def test_a_held_trigger_is_let_go_when_the_job_is_back_to_speed() -> None:
    mid = math.sqrt(20.0 * 25.0)  # 22.36 ms: the midpoint in log time
    d = TriggerDeferral()
    d.hold("slowdown", DETAIL, now_s=0.0)
    assert d.check(2.0, [mid * 1.01] * 20, lambda r: False) is None and d.held is not None  # still slow
    assert d.check(4.0, [mid * 0.99] * 20, lambda r: True) is None and d.held is None and d.passed == 1
    # intermittent stalls keep the mean up: 2 of 20 iterations at +30 ms
    d.hold("slowdown", DETAIL, now_s=5.0)
    assert d.check(6.0, [20.0] * 18 + [50.0, 50.0], lambda r: False) is None and d.held is not None


def test_held_too_long_expires_and_a_newer_detection_keeps_the_first_time() -> None:
    d = TriggerDeferral(max_wait_s=60.0)
    d.hold("slowdown", DETAIL, now_s=0.0)
    d.hold("slowdown", {**DETAIL, "baseline_ms": 21.0, "recent_ms": 27.0}, now_s=40.0)
    assert d.held is not None and d.held.since_s == 0.0 and d.held.base_ms == 21.0
    assert d.check(61.0, [27.0] * 20, lambda r: False) is None and d.held is None and d.expired == 1


def test_a_detection_without_levels_is_not_held() -> None:
    d = TriggerDeferral()
    assert not d.hold("slowdown", {"ratio": 1.3}, 0.0) and d.held is None
    assert slow_levels({"baseline_ms": 20.0, "recent_ms": 19.0}) is None
    assert slow_levels({"shortest_ms": 10.0, "mean_ms": 12.0}) == (10.0, 12.0)
    assert d.check(1.0, [], lambda r: True) is None


def test_a_window_that_opens_anyway_covers_the_held_trigger() -> None:
    d = TriggerDeferral()
    d.hold("slowdown", DETAIL, now_s=0.0)
    d.cover()
    d.cover()  # nothing held: no count
    assert d.held is None and d.covered == 1
    assert d.check(5.0, [30.0] * 20, lambda r: True) is None  # nothing left to send twice


def test_expiry_does_not_wait_for_iterations() -> None:
    d = TriggerDeferral(max_wait_s=10.0)
    d.hold("slowdown", DETAIL, now_s=0.0)
    assert d.check(11.0, [], lambda r: False) is None and d.held is None and d.expired == 1


def test_a_window_measured_at_zero_cost_does_not_make_every_blip_worth_one() -> None:
    b = CostBudget(started_s=0.0)
    b.spend(10.0, 0.0, manual=False)  # a negative estimate spends 0
    assert b.expected_s(12.0) == 0.0
    assert not b.worth(12.0, 1.01)  # weighed against MIN_WORTH_S (1 s): 0.12 s
    assert b.worth(12.0, 1.2)  # 2 s


def test_the_meter_keeps_a_trigger_the_budget_cannot_pay_for_yet() -> None:
    from perftracker.runtime.window.cost import WindowCostMeter

    class Rt:
        iteration = 100
        def recent_iteration_ms(self) -> list[float]:
            return [25.0] * 20
        def training_started_s(self) -> float:
            return 0.0

    now = [8.0]
    m = WindowCostMeter(Rt(), None, CostBudget(initial_s=10.0), clock=lambda: now[0])
    assert m.hold_if_not_worth("slowdown", DETAIL)  # 8 s trained: 1.6 s < 5 s
    m.budget.spend(9.0, 9.0, manual=False)  # another window spent 9 of the 10 s
    now[0] = 40.0  # 1.25x over 40 s is 8 s: not worth the 9 s the last window cost
    assert m.due_held_trigger() is None and m.deferral.held is not None
    now[0] = 60.0  # worth it (12 s), but 10 - 9 = 1 s is left of the budget: kept held, not counted sent
    assert m.due_held_trigger() is None and m.deferral.held is not None and m.deferral.sent_late == 0
    now[0] = 905.0  # 2 % of 905 s is 18.1 s: 9.1 s left >= 9 s, within the 900 s the trigger may wait
    due = m.due_held_trigger()
    assert due is not None and due[0] == "slowdown" and m.deferral.sent_late == 1
