"""What a profile window cost the training job, as a worker reports it and a report carries it
(issue 30): the fields, and their reader. The worker makes them (perftracker/runtime/window/cost.py,
``report_fields``); a PatternSet and the wire carry them; the report shows the worst rank's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perftracker.errors import SchemaError
from perftracker.model.schema import float_items

# what a window cost and the budget (perftracker/runtime/window/cost.py), as the report carries them
WINDOW_COST_KEYS = (
    "window_s",  # how long the window recorded (the longest rank's)
    "blocked_s",  # the training thread's blocking stop (the worst rank's)
    "budget_s",  # what windows could spend over the trailing hour when this one opened (s; window_budget.py)
    "spent_s",  # measured training time lost to windows in the hour before this one (the worst rank's)
    "left_s",  # what was left of the budget when this window opened (the least of any rank)
    "last_cost_s",  # the last measured window's cost before this one (the worst rank's)
    "cost_s",  # this window's own cost, when its process ended first: measured at the exit (the worst rank's)
    "cost_partial",  # 1: cost_s was measured to the exit (no after-phase), 0: after the window
)


def window_cost_fields(d: Mapping[str, Any], where: str) -> dict[str, float]:
    """A window-cost mapping: only known keys, finite numbers (SchemaError otherwise)."""
    out = {}
    for k, v in d.items():
        if k not in WINDOW_COST_KEYS:
            raise SchemaError(f"{where}: unknown key {k!r:.40}")
        out[k] = float_items([v], f"{where}.{k}")[0]
    return out


def worst_of(costs: list[Mapping[str, float]]) -> dict[str, float]:
    """The report's window cost over its ranks: the largest of each field, the least budget left."""
    out: dict[str, float] = {}
    for c in costs:
        for k, v in c.items():
            if k not in out:
                out[k] = float(v)
            else:
                out[k] = min(out[k], float(v)) if k == "left_s" else max(out[k], float(v))
    return {k: out[k] for k in WINDOW_COST_KEYS if k in out}
