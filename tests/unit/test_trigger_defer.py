"""A detector's trigger held until its slowdown is worth a window (issue 30): window_budget.worth_window
and trigger_defer.TriggerDeferral. Found and not found, near the bars."""

from __future__ import annotations

import math

import pytest

from perftracker.runtime.trigger_defer import TriggerDeferral, slow_levels
from perftracker.runtime.window_budget import CostBudget, worth_window

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
