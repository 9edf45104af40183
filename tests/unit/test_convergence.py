"""The window's convergence test (perftracker/runtime/convergence.py, issue 30): a case that must
converge and a twin that must not, near the tolerance and far from it. Seeded."""

from __future__ import annotations

import numpy as np
import pytest

from perftracker.runtime.convergence import (
    MIN_ITERATIONS,
    MIN_S,
    converged,
    phase_betas,
    window_converged,
)

NAMES = ("optimizer step", "rest of the iteration")


def _phases(n: int, step_ms: float, rest_ms: float, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    arr = np.column_stack([np.full(n, step_ms), np.full(n, rest_ms)])
    return arr * (1.0 + noise * rng.standard_normal(arr.shape)).clip(0.5, 1.5)


def test_steady_phases_converge() -> None:
    got = converged(_phases(40, 10.0, 90.0, noise=0.02, seed=1), NAMES, window_s=6.0)
    assert got.converged and got.iterations == 40 and got.reason == "converged"


def test_too_few_iterations_or_too_short_do_not() -> None:
    steady = _phases(40, 10.0, 90.0)
    assert not converged(steady[:MIN_ITERATIONS - 1], NAMES, window_s=6.0).converged
    assert converged(steady[:MIN_ITERATIONS], NAMES, window_s=6.0).converged
    short = converged(steady, NAMES, window_s=1.0)
    assert not short.converged and "of 5 s" in short.reason
    # the minimum is the window the fault suites score (bench/faultkit: 5 s): just under it, not yet
    assert not converged(steady, NAMES, window_s=MIN_S - 0.1).converged
    assert converged(steady, NAMES, window_s=MIN_S).converged


@pytest.mark.parametrize(("second_beta", "want"), [(0.20, True), (0.21, True), (0.225, False), (0.60, False)])
def test_a_phase_whose_share_moves_between_the_halves(second_beta: float, want: bool) -> None:
    """The step's share goes 0.20 -> x with the iteration time kept: +5 % converges; +12.5 % (0.025,
    beyond the 0.02 floor) and a tripling do not."""
    first = _phases(20, 20.0, 80.0)
    second = _phases(20, 100.0 * second_beta, 100.0 * (1 - second_beta))
    got = converged(np.vstack([first, second]), NAMES, window_s=6.0)
    assert got.converged is want, got


def test_near_the_relative_tolerance() -> None:
    # step β 0.30 -> 0.327 (+8.9 %): converged; 0.30 -> 0.336 (+10.7 %): not (both beyond the 0.02 floor)
    base = _phases(20, 30.0, 70.0)
    assert converged(np.vstack([base, _phases(20, 32.7, 67.3)]), NAMES, window_s=6.0).converged
    got = converged(np.vstack([base, _phases(20, 33.6, 66.4)]), NAMES, window_s=6.0)
    assert not got.converged and got.worst_phase == "optimizer step" and got.worst_change > 0.10


def test_a_small_phase_moving_within_the_absolute_floor_does_not_hold_the_window() -> None:
    # 0.5 % -> 1.5 % of the time: +200 % relative, but 0.01 absolute
    base = _phases(20, 0.5, 99.5)
    assert converged(np.vstack([base, _phases(20, 1.5, 98.5)]), NAMES, window_s=6.0).converged


def test_an_iteration_time_that_drifts_does_not_converge() -> None:
    # same shares, but the second half's iterations take 20 % longer (the slowdown still building)
    base = _phases(20, 10.0, 90.0)
    got = converged(np.vstack([base, base * 1.2]), NAMES, window_s=6.0)
    assert not got.converged and "median iteration" in got.reason
    assert converged(np.vstack([base, base * 1.05]), NAMES, window_s=6.0).converged


def test_phase_betas_add_up_to_one() -> None:
    b = phase_betas(_phases(30, 7.0, 21.0, noise=0.1, seed=3))
    assert b.sum() == pytest.approx(1.0) and b[0] == pytest.approx(0.25, abs=0.03)


def test_window_converged_from_boundaries_and_step_times() -> None:
    rng = np.random.default_rng(7)
    it_ns = (100e6 * (1 + 0.01 * rng.standard_normal(40))).astype(np.int64)
    b = [0, *np.cumsum(it_ns).tolist()]
    steps = (it_ns // 10).tolist()
    assert window_converged(b[:20], steps[:19], 6.0) is None  # before the minimum: not tested
    assert window_converged(b[:38], steps[:37], 6.0) is None  # 37 iterations: not a 4th one
    got = window_converged(b, steps, 6.0)
    assert got is not None and got.converged
    drifting = steps[:20] + [int(x * 4) for x in it_ns[20:] // 10]  # the step's share 0.1 -> 0.4
    got = window_converged(b, drifting, 6.0)
    assert got is not None and not got.converged and got.worst_phase == "optimizer step"
