"""A pattern set over its byte budget loses, in order: the replay's step record, the older iteration
times (down to MIN_ITERATIONS_KEPT), then its lowest-β patterns; the diagnosis goes last."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from perftracker.agent.summarize.summarizer import MIN_ITERATIONS_KEPT, _fit_budget

from perftracker.model import Category, Pattern, PatternSet


def _set(n_iterations: int, n_patterns: int = 3) -> PatternSet:
    rng = np.random.default_rng(5)
    patterns = tuple(Pattern(key=f"aten::op{i}", category=Category.COMPUTE, beta=0.3 - 0.05 * i, mu=0.5, sigma=0.1)
                     for i in range(n_patterns))
    return PatternSet(job="j", session="s", rank=2, world_size=4, host="h", window_start_ns=0,
                      window_end_ns=10**10, patterns=patterns,
                      iteration_ms=tuple(float(x) for x in rng.uniform(10.0, 20.0, n_iterations)))


def test_a_long_window_keeps_its_patterns_and_its_last_iteration_times() -> None:
    ps = _set(5000)
    budget = 10_000
    assert len(ps.to_bytes()) > budget
    fit = _fit_budget(ps, budget)
    assert len(fit.to_bytes()) <= budget
    assert fit.patterns == ps.patterns  # every function kept (the old trim left 0 of 3 at 5000 steps)
    k = len(fit.iteration_ms)
    assert MIN_ITERATIONS_KEPT <= k < 5000 and fit.iteration_ms == ps.iteration_ms[-k:]
    # the most that fit: one more iteration time would not

    assert len(replace(ps, iteration_ms=ps.iteration_ms[-(k + 1):]).to_bytes()) > budget


def test_a_set_within_budget_is_unchanged_and_patterns_go_only_below_the_iteration_floor() -> None:
    small = _set(200)
    assert _fit_budget(small, 10_000) == small
    # a budget that the floor of iteration times and all patterns cannot meet: patterns go, lowest β first

    many = _set(5000, n_patterns=60)
    floor = len(replace(many, iteration_ms=many.iteration_ms[-MIN_ITERATIONS_KEPT:]).to_bytes())
    budget = floor - 100  # every pattern beside the floor of iteration times does not fit
    fit = _fit_budget(many, budget)
    assert len(fit.to_bytes()) <= budget
    assert len(fit.iteration_ms) == MIN_ITERATIONS_KEPT and 0 < len(fit.patterns) < 60
    assert fit.patterns == many.patterns[:len(fit.patterns)]
