"""A late group whose late ranks are late for different causes (issue 34, imbalance-r2 of the GPU
bench): one late rank's own finding explains its lateness; the cause searched for the group's other
late ranks names them alone, never the explained rank, nor a late rank that spends less in that
cause than the ranks that wait."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.localizer.diagnose.evidence.waits import doing_more
from perftracker.localizer.diagnose.localize import localize_arrays
from perftracker.localizer.diagnose.method.options import LocalizeOptions

from bench import synthetic as sy
from perftracker.model import Category, Report

IDLE = "stall outside traced ops"


def _job(seed: int, gpu_extra: float, idle_ranks: tuple[int, ...], e1: float = 0.15, e2: float = 0.08):
    """8 GPU ranks. Rank 2 computes ``gpu_extra`` more elementwise work (the others wait for it at
    SendRecv); ``idle_ranks`` stall e2 outside any traced op, and with rank 2 they arrive last at the
    AllReduce, where ranks 0, 1, 3, 6, 7 wait e2. Rank 2 spends its e2 computing, unless it is an
    idle rank."""
    arr = sy.simulate_job(8, seed=seed)
    el, sr, ar = (sy.function_index(arr, x) for x in ("elementwise", "SendRecv", "AllReduce"))
    arr.values[el, 0, 2] += gpu_extra + (0.0 if 2 in idle_ranks else e2)
    if gpu_extra > 0:
        arr.values[sr, 0, np.setdiff1d(np.arange(8), [2])] += gpu_extra
    arr.values[ar, 0, [0, 1, 3, 6, 7]] += e2
    arr.values[:, 0, :] /= 1 + gpu_extra + e2
    return arr


def _named(report: Report, category: Category) -> set[int]:
    return {r for f in report.findings if f.category is category for r in f.ranks}


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_late_rank_with_its_own_cause_is_not_named_for_the_others_stall(seed: int) -> None:
    report = localize_arrays(_job(seed, 0.15, (4, 5)), LocalizeOptions(created_ns=1, seed=seed))
    assert _named(report, Category.COMPUTE) == {2}, [f.sentence for f in report.findings]
    idle = [f for f in report.findings if f.label == IDLE]
    assert [f.ranks for f in idle] == [(4, 5)], [f.sentence for f in report.findings]
    assert 2 not in _named(report, Category.PYTHON)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_late_rank_without_a_cause_of_its_own_that_stalls_too_is_named_with_the_others(seed: int) -> None:
    """The twin: rank 2 computes no more and stalls like ranks 4 and 5: one host stall on all three."""
    report = localize_arrays(_job(seed, 0.0, (2, 4, 5)), LocalizeOptions(created_ns=1, seed=seed))
    idle = [f for f in report.findings if f.label == IDLE]
    assert [f.ranks for f in idle] == [(2, 4, 5)], [f.sentence for f in report.findings]


def test_doing_more_names_the_late_ranks_above_the_waiters_median_only() -> None:
    waiting = np.array([0, 1, 3, 6, 7])
    late = np.array([2, 4, 5])
    beta = np.array([0.037, 0.029, 0.020, 0.032, 0.057, 0.056, 0.044, 0.048])  # dlrm imbalance-r2's idle
    assert doing_more(beta, late, waiting, None).tolist() == [4, 5]
    # near the waiters' median (0.037): just below is left out, just above is named
    assert doing_more(np.where(np.arange(8) == 2, 0.0369, beta), late, waiting, None).tolist() == [4, 5]
    assert doing_more(np.where(np.arange(8) == 2, 0.0371, beta), late, waiting, None).tolist() == [2, 4, 5]
    # compared in absolute time: a shorter window makes the same share less time
    window = np.array([1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert doing_more(np.where(np.arange(8) == 2, 0.06, beta), late, waiting, window).tolist() == [4, 5]
    # none above: the late ranks themselves (the cause was chosen on their median)
    assert doing_more(np.full(8, 0.03), late, waiting, None).tolist() == [2, 4, 5]
