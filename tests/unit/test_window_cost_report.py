"""What a window cost, from the worker to the report's header (issue 30, Deliver 3): the worker's
fields (window_cost.report_fields), the PatternSet and the wire that carry them, the worst rank's in
the report, its JSON schema and its header line."""

from __future__ import annotations

import io
import json

import jsonschema
import pytest
from perftracker.localizer.diagnose.method.arrays import pattern_sets_to_arrays
from perftracker.localizer.render import html as html_render
from perftracker.localizer.render import json as json_render
from perftracker.localizer.render import text as text_render
from perftracker.localizer.render.facts import cost_text

from perftracker.errors import SchemaError
from perftracker.model import Category, Pattern, PatternSet, Report
from perftracker.model.window_cost import worst_of
from perftracker.runtime.window.budget import CostBudget
from perftracker.runtime.window.cost import report_fields
from perftracker.wire import patterns as wire_patterns


def _budget_before(spent_s: list[float]) -> dict[str, object]:
    b = CostBudget(started_s=200.0 - 3600.0)  # trained a whole hour: the full 72 s
    for i, s in enumerate(spent_s):
        b.spend(100.0 + i, s, manual=False, session=f"s{i}")
    return b.to_dict(200.0)


def test_report_fields_say_the_window_and_the_budget_before_it() -> None:
    got = report_fields(_budget_before([3.0, 4.5]), 7.25, 0.41)
    assert got == {"window_s": 7.25, "blocked_s": 0.41, "budget_s": 72.0, "spent_s": 7.5, "left_s": 64.5,
                   "last_cost_s": 4.5}
    first = report_fields(_budget_before([]), 20.0, 2.0)  # no window measured yet: no last cost
    assert "last_cost_s" not in first and first["spent_s"] == 0.0 and first["left_s"] == 72.0
    assert report_fields(None, 3.0, 0.1) == {"window_s": 3.0, "blocked_s": 0.1}
    young = CostBudget(started_s=0.0)  # 15 s into training: the 10 s advance is the budget
    assert report_fields(young.to_dict(15.0), 1.0, 0.1)["budget_s"] == 10.0
    # a window measured at its process's exit carries its own cost, labelled partial
    cut = report_fields(_budget_before([]), 4.0, 0.3, {"lost_s": 2.345, "partial": True})
    assert cut["cost_s"] == 2.345 and cut["cost_partial"] == 1.0
    assert "cost_s" not in report_fields(_budget_before([]), 4.0, 0.3, {"lost_s": float("nan")})


def test_the_header_says_a_cost_measured_to_the_exit() -> None:
    rep = Report("j", "s3", "slowdown", 0, "slowdown", 4.0, (0, 1),
                 window_cost={"window_s": 4.0, "blocked_s": 0.3, "cost_s": 2.3, "cost_partial": 1.0, "budget_s": 10.0,
                              "spent_s": 0.0, "left_s": 10.0})
    jsonschema.Draft202012Validator(json_render.load_schema()).validate(rep.to_dict())
    assert cost_text(rep) == ("ran 4.0 s, blocked training 0.30 s; cost 2.3 s of training (to the exit: partial); "
                              "budget 10.0 s over the last hour: 0.0 s spent in the hour before it, 10.0 s left")
    whole = Report("j", "s4", "slowdown", 0, "slowdown", 4.0, (0, 1), window_cost={"cost_s": 2.3, "cost_partial": 0.0})
    assert cost_text(whole) == "cost 2.3 s of training"


def test_worst_of_takes_the_largest_cost_and_the_least_left() -> None:
    got = worst_of([{"blocked_s": 0.4, "left_s": 60.0, "window_s": 7.0}, {"blocked_s": 1.2, "left_s": 50.0},
                    {}])
    assert got == {"window_s": 7.0, "blocked_s": 1.2, "left_s": 50.0}
    assert worst_of([]) == {}


def _ps(rank: int, cost: dict[str, float]) -> PatternSet:
    return PatternSet("j", "s1", rank, 2, "h", 0, 7_000_000_000,
                      (Pattern("aten::mm", Category.COMPUTE, 0.5, 0.9, 0.05, "aten::mm", 10, 1000, "cpu"),),
                      window_cost=cost)


def test_the_cost_travels_through_the_pattern_set_and_the_wire_to_the_arrays() -> None:
    sets = [_ps(0, {"blocked_s": 0.4, "left_s": 60.0}), _ps(1, {"blocked_s": 1.2, "left_s": 50.0})]
    assert PatternSet.from_dict(json.loads(json.dumps(sets[1].to_dict()))).window_cost == sets[1].window_cost
    batch = wire_patterns.decode_batch(wire_patterns.encode_batch(wire_patterns.batch_from_sets(sets)))
    assert [s.window_cost for s in wire_patterns.batch_to_sets(batch)] == [s.window_cost for s in sets]
    assert pattern_sets_to_arrays(sets).window_cost == {"blocked_s": 1.2, "left_s": 50.0}
    # a worker that sent none: nothing in its dict, nothing in the report
    assert "window_cost" not in _ps(0, {}).to_dict()


@pytest.mark.parametrize("bad", [{"blocked_s": "slow"}, {"nonsense_s": 1.0}, {"blocked_s": float("nan")}])
def test_a_bad_cost_is_a_schema_error(bad: dict[str, object]) -> None:
    d = _ps(0, {}).to_dict()
    d["window_cost"] = bad
    with pytest.raises(SchemaError):
        PatternSet.from_dict(d)


def test_the_report_carries_level_and_cost_and_the_header_shows_them() -> None:
    rep = Report("j", "s1", "slowdown", 0, "slowdown", 7.0, (0, 1),
                 window_cost={"window_s": 7.0, "blocked_s": 1.2, "budget_s": 72.0, "spent_s": 7.5, "left_s": 64.5})
    d = rep.to_dict()
    assert d["level"] == "window" and d["window_cost"]["left_s"] == 64.5
    jsonschema.Draft202012Validator(json_render.load_schema()).validate(d)
    assert Report.from_dict(d).window_cost == rep.window_cost
    buf = io.StringIO()
    text_render.render(rep, buf, color=False, width=160)
    out = buf.getvalue()
    line = cost_text(rep)
    assert line == ("ran 7.0 s, blocked training 1.20 s; budget 72.0 s over the last hour: 7.5 s spent in the hour "
                    "before it, 64.5 s left")
    assert line in out and "profile window" in out
    page = io.StringIO()
    html_render.render(rep, page)
    assert line in page.getvalue()
    # a report without the fields (older workers): no cost line, its level still said
    old = Report("j", "s2", "hang", 0, "hang", 0.0, (0,))
    assert cost_text(old) == "" and old.to_dict()["level"] == "snapshot"
    jsonschema.Draft202012Validator(json_render.load_schema()).validate(old.to_dict())
