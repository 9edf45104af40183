"""Distances: D_exp, max normalization, and the exact fast D_diff against the definition."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.localizer.diagnose.method.distances import (
    differential_distance,
    differential_distance_blocks,
    distance_from_expectation,
    exact_median,
    normalization_maxima,
    normalize_by_max,
    outside_expectation,
    sample_workers,
)


def test_distance_from_expectation_is_l1_to_the_box() -> None:
    values = np.array([[0.05, 0.005, 0.0], [0.5, 0.5, 1.0], [0.2, 0.9, 0.0]])  # (3, N=3)
    lo = np.array([0.0, 0.1, 0.0])
    hi = np.array([0.01, 1.0, 0.5])
    d = distance_from_expectation(values, lo, hi)
    assert d == pytest.approx([0.04, 0.4, 0.0 + 0.0 + 0.0 + 0.0])
    assert outside_expectation(values, lo, hi).tolist() == [True, True, False]


def test_outside_matches_distance_on_random_boxes() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        values = rng.random((3, 500))
        a, b = np.sort(rng.random((2, 3)), axis=0)
        a[rng.random(3) < 0.3] = 0.0
        b[rng.random(3) < 0.3] = 1.0
        assert np.array_equal(outside_expectation(values, a, b), distance_from_expectation(values, a, b) > 0)


def test_normalize_by_max_keeps_zero_dimensions_zero() -> None:
    values = np.array([[0.1, 0.2, 0.4], [0.0, 0.0, 0.0], [0.3, 0.3, 0.6]])
    p = normalize_by_max(values)
    assert p[0].tolist() == [0.25, 0.5, 1.0]
    assert p[1].tolist() == [0.0, 0.0, 0.0]
    assert p[2].tolist() == [0.5, 0.5, 1.0]


def test_sample_is_seeded_sorted_unique_and_capped() -> None:
    s1, s2 = sample_workers(10_000, 100, 7), sample_workers(10_000, 100, 7)
    assert np.array_equal(s1, s2)
    assert s1.size == 100 and np.all(np.diff(s1) > 0)
    assert not np.array_equal(s1, sample_workers(10_000, 100, 8))
    assert sample_workers(8, 100, 0).tolist() == list(range(8))


def test_blocks_match_the_definition_by_loops() -> None:
    rng = np.random.default_rng(2)
    p = rng.random((3, 60))
    sample = sample_workers(60, 25, 3)
    expected = [sum(1 for s in sample if abs(p[:, w] - p[:, s]).sum() > 0.4) for w in range(60)]
    assert differential_distance_blocks(p, sample, 0.4).tolist() == expected


def _clustered(rng: np.random.Generator, n: int, centers: int, spread: float) -> np.ndarray:
    c = rng.random((3, centers))
    which = rng.integers(0, centers, n)
    return np.clip(c[:, which] + rng.normal(0, spread, (3, n)), 0.0, 1.0)


@pytest.mark.parametrize("grid", [2, 8, 32, 64])
@pytest.mark.parametrize("kind", ["uniform", "clusters", "tight", "lattice"])
def test_grid_is_exactly_the_definition(grid: int, kind: str) -> None:
    rng = np.random.default_rng(abs(hash((grid, kind))) % 2**32)
    n = 4000
    if kind == "uniform":
        p = rng.random((3, n))
    elif kind == "clusters":
        p = _clustered(rng, n, 4, 0.05)
    elif kind == "tight":
        p = _clustered(rng, n, 2, 0.002)
    else:  # values on a 0.1 lattice and on cell edges: distances of exactly ε, ties everywhere
        p = rng.integers(0, 11, (3, n)) / 10.0
        p[:, : n // 4] = rng.integers(0, grid + 1, (3, n // 4)) / grid
    raw = p * np.array([[0.3], [0.9], [0.07]])  # raw patterns; P̂ = raw / max
    p = normalize_by_max(raw)
    sample = sample_workers(n, 100, 5)
    expected = differential_distance_blocks(p, sample, 0.4)
    assert np.array_equal(differential_distance(p, sample, 0.4, grid, refine_cells=0), expected)
    assert np.array_equal(differential_distance(p, sample, 0.4, grid, refine_cells=4 * grid), expected)
    assert np.array_equal(differential_distance(raw, sample, 0.4, grid, maxima=raw.max(axis=1)), expected)


def test_grid_handles_degenerate_inputs() -> None:
    p = np.zeros((3, 50))
    sample = sample_workers(50, 100, 0)
    assert differential_distance(p, sample, 0.4).tolist() == [0] * 50
    one = np.ones((3, 1))
    assert differential_distance(one, sample_workers(1, 100, 0), 0.4).tolist() == [0]
    assert differential_distance(np.zeros((3, 0)), np.zeros(0, dtype=np.int64), 0.4).size == 0


def test_raw_path_with_a_zero_dimension() -> None:
    rng = np.random.default_rng(9)
    raw = np.vstack([rng.random(3000) * 0.2, np.zeros(3000), rng.random(3000) * 0.05])
    sample = sample_workers(3000, 100, 1)
    assert np.array_equal(differential_distance(raw, sample, 0.4, maxima=raw.max(axis=1)),
                          differential_distance_blocks(normalize_by_max(raw), sample, 0.4))


@pytest.mark.parametrize("n", [10, 49_999, 100_000, 100_001])
def test_exact_median_is_numpy_median(n: int) -> None:
    rng = np.random.default_rng(n)
    for x in (rng.random(n), rng.integers(0, 3, n) / 7.0, rng.lognormal(0, 3, n), np.zeros(n),
              np.r_[np.zeros(n // 2 + 1), rng.random(n - n // 2 - 1)]):
        assert exact_median(x) == np.median(x)


def test_materiality_floor_keeps_tiny_differences_below_eps() -> None:
    # measured on a clean 4-rank CPU job: c10d::allreduce_ with β ≈ 1-2% and a NIC μ of ~1e-5 on one
    # rank and 0 on the others; P / max made that rank unique (μ̂ 1 vs 0)
    values = np.array([[0.021, 0.0124, 0.0148, 0.0143], [1.8e-5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    plain = differential_distance_blocks(normalize_by_max(values), np.arange(4), 0.4)
    assert plain.tolist() == [3, 1, 1, 1]
    floor = 0.01 / 0.4
    floored = differential_distance_blocks(normalize_by_max(values, floor), np.arange(4), 0.4)
    assert floored.tolist() == [0, 0, 0, 0]
    maxima = normalization_maxima(values, floor)
    assert maxima.tolist() == pytest.approx([0.025, 0.025, 0.0])
    assert differential_distance(values, np.arange(4), 0.4, maxima=maxima).tolist() == floored.tolist()
    # above the floor P / max is unchanged
    big = np.array([[0.1, 0.2, 0.4], [0.0, 0.0, 0.0], [0.3, 0.3, 0.6]])
    assert np.array_equal(normalize_by_max(big, floor), normalize_by_max(big))
    # a function only one worker runs, just above β_min, is still farther than ε from the others
    lone = np.array([[0.0, 0.0101, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert differential_distance_blocks(normalize_by_max(lone, floor), np.arange(3), 0.4).tolist() == [1, 2, 1]
