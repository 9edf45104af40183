"""When a profile window has seen enough (issue 30, Deliver 1): a pure test over per-iteration
phase times, numpy only.

A window used to run ``window_s`` (20 s) every time. It now ends at the first iteration boundary
where the patterns have converged: at least ``min_iterations`` complete iterations and
``min_s`` of window, and, between the first and the second half of the window's iterations,

- the median iteration time changed by at most ``tolerance`` (relative), and
- each phase's β (its share of the half's time) changed by at most ``tolerance`` relative to
  the larger of the two, or by at most ``abs_floor`` (a phase of 0.4 % of the time that moves to
  0.6 % is not a reason to keep profiling).

What "phase" means here: the training process cannot compute each critical-path function's β
during the window without reading Kineto's result, which only the profiler's stop delivers. What
it has cheaply, per iteration, is what the hooks see: the optimizer step (step pre-hook to
post-hook) and the rest of the iteration (data loading, forward, backward, waits in collectives).
Those are the phases tested here; ``PERFTRACKER_WINDOW_S`` stays the upper bound for a window
that never converges. A function whose share moves while both phases stay put is not seen by this
test (docs/profile-window.md, "How long a window lasts").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_ITERATIONS = 20
TOLERANCE = 0.10
ABS_FLOOR = 0.02
# the shortest window: the length the fault suites' accuracy is measured at (bench/faultkit's
# scenarios, window_s 5). At 2 s every steady fault "converged" at the minimum and the quick suite
# lost its findings (docs/profile-window.md, "Why it is off by default")
MIN_S = 5.0


@dataclass(frozen=True)
class Convergence:
    converged: bool
    iterations: int
    reason: str  # why not (or "converged"): the first test that failed
    worst_phase: str = ""
    worst_change: float = 0.0  # the largest relative change seen (iteration time or a phase's β)


def phase_betas(phase_ms: np.ndarray) -> np.ndarray:
    """Each phase's share of the iterations' total time: ``phase_ms`` is iterations × phases, the
    phases of an iteration adding up to its duration."""
    total = float(phase_ms.sum())
    if total <= 0.0:
        return np.zeros(phase_ms.shape[1] if phase_ms.ndim == 2 else 0)
    return np.asarray(phase_ms.sum(axis=0) / total, dtype=float)


def converged(phase_ms: np.ndarray, phase_names: tuple[str, ...], window_s: float,
              min_iterations: int = MIN_ITERATIONS, tolerance: float = TOLERANCE, abs_floor: float = ABS_FLOOR,
              min_s: float = MIN_S) -> Convergence:
    """Has the window seen enough? ``phase_ms``: one row per complete iteration of the window, one
    column per phase (``phase_names``), in ms; ``window_s``: how long the window has run."""
    arr = np.asarray(phase_ms, dtype=float)
    n = int(arr.shape[0]) if arr.ndim == 2 else 0
    if n < max(min_iterations, 2):
        return Convergence(False, n, f"{n} of {min_iterations} iterations")
    if window_s < min_s:
        return Convergence(False, n, f"{window_s:.1f} of {min_s:g} s")
    half = n // 2
    first, second = arr[:half], arr[n - half:]  # an odd middle iteration is in neither half
    it1, it2 = float(np.median(first.sum(axis=1))), float(np.median(second.sum(axis=1)))
    worst_name, worst = "iteration", abs(it2 - it1) / max(it1, it2, 1e-9)
    if worst > tolerance:
        return Convergence(False, n, f"median iteration {it1:.1f} -> {it2:.1f} ms", worst_name, worst)
    b1, b2 = phase_betas(first), phase_betas(second)
    for name, x, y in zip(phase_names, b1.tolist(), b2.tolist(), strict=True):
        change = abs(y - x) / max(x, y, 1e-9)
        if abs(y - x) > abs_floor and change > tolerance:
            return Convergence(False, n, f"{name} β {x:.3f} -> {y:.3f}", name, change)
        if abs(y - x) > abs_floor and change > worst:
            worst_name, worst = name, change
    return Convergence(True, n, "converged", worst_name, worst)


PHASES = ("optimizer step", "rest of the iteration")


def window_converged(boundaries_ns: list[int], step_ns: list[int], elapsed_s: float,
                     min_iterations: int = MIN_ITERATIONS, tolerance: float = TOLERANCE,
                     min_s: float = MIN_S, every: int = 4) -> Convergence | None:
    """The test on a running window: its iteration boundaries and each iteration's optimizer step
    time (0 where none was seen). None (not tested) before ``min_iterations`` and between every
    ``every``-th iteration: the training thread pays a few numpy calls over a few hundred numbers
    at most once per ``every`` iterations."""
    n = len(boundaries_ns) - 1
    if n < min_iterations or n % every or len(step_ns) != n:
        return None
    it_ns = np.diff(np.asarray(boundaries_ns, dtype=np.int64))
    step = np.clip(np.asarray(step_ns, dtype=np.int64), 0, it_ns)
    phases = np.stack([step, it_ns - step], axis=1) / 1e6
    return converged(phases, PHASES, elapsed_s, min_iterations, tolerance, min_s=min_s)
