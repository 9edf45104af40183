"""The rule and its MAD threshold, including the degenerate MAD = 0 case."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.localizer.diagnose.method.rule import (
    apply_rule,
    differential_threshold,
    median_of_counts,
    minority_only,
    small_job_count,
    small_job_threshold,
)
from statsmodels.robust.scale import mad


def test_threshold_is_median_plus_k_mad_when_counts_spread() -> None:
    rng = np.random.default_rng(0)
    counts = rng.integers(10, 60, 5000)
    t = differential_threshold(counts, k=5.0, sample_size=100)
    assert t.median == np.median(counts)
    assert t.mad == pytest.approx(mad(counts.astype(float)))
    assert not t.floored
    assert t.threshold == pytest.approx(np.median(counts) + 5.0 * mad(counts.astype(float)))


def test_degenerate_mad_is_floored_so_a_clean_job_flags_nothing() -> None:
    counts = np.zeros(1000, dtype=np.int64)
    counts[[3, 70, 500]] = [4, 9, 13]  # noise tails of a healthy job
    t = differential_threshold(counts, k=5.0, sample_size=100)
    assert t.mad == 0.0 and t.floored
    assert t.threshold == pytest.approx(25.0)  # median + |S|/4
    beta = np.full(1000, 0.3)
    by_exp, by_diff = apply_rule(beta, np.zeros(1000, bool), counts, t.threshold, 0.01)
    assert not by_diff.any() and not by_exp.any()


def test_degenerate_mad_still_flags_a_unique_worker() -> None:
    counts = np.zeros(1000, dtype=np.int64)
    counts[42] = 99  # farther than ε from all other sampled workers
    t = differential_threshold(counts, k=5.0, sample_size=100)
    _, by_diff = apply_rule(np.full(1000, 0.2), np.zeros(1000, bool), counts, t.threshold, 0.01)
    assert np.flatnonzero(by_diff).tolist() == [42]


def test_small_job_unique_rank_clears_the_floor() -> None:
    counts = np.array([1, 1, 1, 7, 1, 1, 1, 1])  # 8 ranks, |S| = 8, rank 3 differs from all
    t = differential_threshold(counts, k=5.0, sample_size=8)
    assert t.threshold == pytest.approx(1 + 2.0)
    assert (counts > t.threshold).tolist() == [False, False, False, True] + [False] * 4


def test_beta_min_gates_both_tests() -> None:
    beta = np.array([0.005, 0.01, 0.02, 0.5])
    outside = np.array([True, True, True, False])
    d = np.array([100, 100, 0, 100])
    by_exp, by_diff = apply_rule(beta, outside, d, 10.0, 0.01)
    assert by_exp.tolist() == [False, False, True, False]
    assert by_diff.tolist() == [False, False, False, True]


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_median_of_counts_is_numpy_median(n: int) -> None:
    rng = np.random.default_rng(n)
    for hi in (1, 3, 100):
        c = rng.integers(0, hi + 1, n)
        assert median_of_counts(c) == np.median(c)


def test_eight_ranks_one_rank_far_from_all_is_caught_by_the_small_job_test_not_by_mad() -> None:
    # rank 0 is ε-far from all 7 peers; among the others the counts spread by one (noise)
    counts = np.array([7, 2, 1, 3, 1, 2, 1, 3])
    paper = differential_threshold(counts, k=5.0, sample_size=8)
    assert paper.threshold > 7  # median 2 + 5 · 1.48: no single rank of 8 can pass (issue 15)
    t = small_job_threshold(counts, share=0.75)
    assert t.method == "small_job" and small_job_count(8, 0.75) == 6
    assert (counts > t.threshold).tolist() == [True] + [False] * 7
    near = np.array([5, 2, 1, 3, 1, 2, 1, 3])  # far from 5 of 7 peers only: not enough
    assert not (near > small_job_threshold(near, 0.75).threshold).any()


@pytest.mark.parametrize(("n", "c"), [(3, 2), (4, 3), (5, 3), (8, 6), (16, 12)])
def test_small_job_count_is_three_quarters_of_the_peers_rounded_up(n: int, c: int) -> None:
    assert small_job_count(n, 0.75) == c


def test_two_ranks_flag_nothing_and_a_split_job_flags_nothing() -> None:
    assert small_job_threshold(np.array([1, 1]), 0.75).threshold == np.inf
    assert small_job_threshold(np.array([1, 1]), 0.75).method == "none"
    assert minority_only(np.array([True, True, False, False])).tolist() == [False] * 4
    assert minority_only(np.array([True, False, False, False])).tolist() == [True, False, False, False]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_numpy_mad_is_statsmodels_mad(seed: int) -> None:
    """The rule computes statsmodels' scaled MAD with numpy (the base install has no statsmodels)."""
    from perftracker.localizer.diagnose.method.rule import scaled_mad

    rng = np.random.default_rng(seed)
    for n in (1, 2, 7, 100):
        x = rng.integers(0, 40, n).astype(float)
        center = float(np.median(x)) + (0.5 if seed == 2 else 0.0)
        assert scaled_mad(x, center) == pytest.approx(float(mad(x, center=center)))
