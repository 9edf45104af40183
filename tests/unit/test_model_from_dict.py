"""PatternSet.from_dict: its fast path for well-formed rows accepts exactly what the full per-row
validation (``_pattern_from_row``) accepts, builds the same Patterns, and every malformed row still
gets the full validation's error naming the field."""

from __future__ import annotations

import copy
import json
import math
import random
from typing import Any

import pytest

from perftracker.errors import SchemaError
from perftracker.model import Category, Pattern, PatternSet, _pattern_from_row


def _valid() -> dict[str, Any]:
    pats = [Pattern("train.py:1 in main;model.py:40 in forward", Category.PYTHON, 0.002, 0.9, 0.01, executions=3,
                    critical_ns=10, resource="cpu"),
            Pattern("train.py:1 in main;data.py:7 in load", Category.PYTHON, 0.3, 0.1, 0.0, label="load"),
            Pattern("aten::mm", Category.COMPUTE, 0.5, 0.95, 0.02, label="aten::mm", executions=100,
                    critical_ns=10**9, resource="sm"),
            Pattern("nccl:all_reduce", Category.COLLECTIVE, 0.1, 0.3, 0.05, executions=2, critical_ns=5),
            Pattern("aten::copy_", Category.MEMORY, 0.0, 1.0, 1.0)]
    ps = PatternSet(job="j", session="s", rank=1, world_size=2, host="h", window_start_ns=0, window_end_ns=10**9,
                    patterns=tuple(pats))
    return json.loads(json.dumps(ps.to_dict()))


# values a field of a row may be replaced with: well-formed, odd-but-accepted and malformed ones
_FUZZ = [0, 1, 2, -1, 9, True, False, 0.5, 1.0, 0.0, 1 + 1e-10, -1e-10, 1.5, -0.5, math.nan, math.inf, "0.5",
         "compute", "python", "memory", "bogus", "", "x;y", None, [], [0], [0, 1], [1, 0], [-1], [99], ["0"], [0.0],
         [1.5], [True], [None], {}, 10**20]


def _reference(d: dict[str, Any]) -> tuple[Pattern, ...]:
    """The patterns the full validation gives, row by row (raises its SchemaError)."""
    frames = d.get("frames") or []
    return tuple(_pattern_from_row(row, frames, f"PatternSet.patterns[{i}]") for i, row in enumerate(d["patterns"]))


def _outcome(fn: Any, d: dict[str, Any]) -> tuple[str, Any]:
    try:
        got = fn(d)
    except SchemaError as exc:
        return "error", str(exc)
    patterns = got.patterns if isinstance(got, PatternSet) else got
    return "ok", [(p.key, p.category, repr(p.beta), repr(p.mu), repr(p.sigma), p.label, p.executions, p.critical_ns,
                   p.resource, type(p.beta), type(p.executions)) for p in patterns]


def test_round_trip_is_unchanged() -> None:
    d = _valid()
    ps = PatternSet.from_dict(d)
    assert ps.patterns[0].key == "train.py:1 in main;model.py:40 in forward" and ps.patterns[0].label == "model.py:40 in forward"
    assert ps.patterns[1].label == "load" and ps.patterns[2].category is Category.COMPUTE
    assert PatternSet.from_dict(ps.to_dict()) == ps
    assert _outcome(PatternSet.from_dict, d) == _outcome(_reference, d)


def test_fast_path_agrees_with_full_validation_on_fuzzed_rows() -> None:
    rng = random.Random(7)
    base = _valid()
    n_ok = n_err = 0
    for _ in range(4000):
        d = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(d["patterns"]))
            row = d["patterns"][at]
            if not isinstance(row, list):
                continue
            if rng.random() < 0.05:  # the row itself malformed
                d["patterns"][at] = rng.choice([None, "row", row[:8], [*row, 0], tuple(row)])
                continue
            row[rng.randrange(9)] = copy.deepcopy(rng.choice(_FUZZ))
        if rng.random() < 0.05:
            d["frames"] = rng.choice([[], ["only"], [1, 2], ["a", "b", "c", "d"]])
        got, want = _outcome(PatternSet.from_dict, d), _outcome(_reference, d)
        assert got == want, (d["patterns"], got, want)
        n_ok += got[0] == "ok"
        n_err += got[0] == "error"
    assert n_ok > 300 and n_err > 1000  # both outcomes were exercised


@pytest.mark.parametrize(("index", "value", "message"), [
    (1, "gpu", r"PatternSet\.patterns\[2\]: unknown category 'gpu'"),
    (0, [7], r"PatternSet\.patterns\[2\]: bad frame index in stack"),
    (0, "", r"PatternSet\.patterns\[2\]: function key must be a non-empty string"),
    (2, math.nan, r"PatternSet\.patterns\[2\]\.beta: not a finite number: nan"),
    (3, 1.5, r"PatternSet\.patterns\[2\]\.mu: 1\.5 outside \[0, 1\]"),
    (4, True, r"PatternSet\.patterns\[2\]\.sigma: not a finite number: True"),
    (6, 1.0, r"PatternSet\.patterns\[2\]: executions and critical_ns must be integers"),
])
def test_errors_still_name_the_row_and_field(index: int, value: Any, message: str) -> None:
    d = _valid()
    d["patterns"][2][index] = value
    with pytest.raises(SchemaError, match=message):
        PatternSet.from_dict(d)
    d = _valid()
    d["patterns"][2] = d["patterns"][2][:8]
    with pytest.raises(SchemaError, match=r"PatternSet\.patterns\[2\]: expected a list of 9 fields"):
        PatternSet.from_dict(d)
