"""The rule: f on w is abnormal if β > β_min ∧ (D_exp > 0 ∨ D_diff > median + k·MAD).

The MAD comes from statsmodels (``statsmodels.robust.scale.mad``: the median absolute deviation
divided by Φ⁻¹(3/4) ≈ 0.6745, so that it estimates σ for normal data).

**[decision] Degenerate MAD.** D_diff is a count of sampled workers, an integer in [0, |S|]. When
more than half of the workers share one count (the usual case for a healthy job, where nearly every
worker is within ε of nearly every other and D_diff is 0), the MAD is 0 and the bare rule would flag
any worker that is farther than ε from a single sampled worker: one noisy worker out of 1,000 makes
a finding. We floor the (scaled) MAD at ``margin · |S| / k`` with ``margin = 0.25``, so that the
threshold is never below median + |S|/4: a worker is abnormal by the differential test only if it is
farther than ε from at least a quarter of the sampled workers more than the typical worker is. This
is scale-free (it holds for |S| = 8 and |S| = 100 alike) and keeps what the test is for: a group of g%
of the workers that differs from the rest has D_diff ≈ 100 − g% of |S| against a median of about g%,
so every group below ~40% of the job still clears it. A first version floored the raw MAD at one
count (|S|/100); on a clean synthetic job with realistic noise the tail workers reached 9–13 of 100,
which that floor flagged, so one count was below the resolution that matters. The floor acts only
when the counts really do not spread; otherwise the paper's median + k·MAD stands.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from statsmodels.robust.scale import mad as _statsmodels_mad

GAUSSIAN_3_4 = 0.6744897501960817  # Φ⁻¹(3/4), statsmodels' default normalization constant


@dataclass(frozen=True)
class Threshold:
    """The differential threshold of one function and how it came about."""

    median: float
    mad: float  # statsmodels' (scaled) MAD of D_diff
    mad_used: float  # after the degenerate-MAD floor
    threshold: float  # median + k · mad_used
    floored: bool


DEFAULT_MARGIN = 0.25  # the floor's share of |S|, see the module doc


def differential_threshold(d_diff: np.ndarray, k: float, sample_size: int,
                           margin: float = DEFAULT_MARGIN) -> Threshold:
    """median + k·MAD over all workers' D_diff, with the degenerate-MAD floor (see the module doc)."""
    counts = np.asarray(d_diff, dtype=np.float64)
    if counts.size == 0:
        return Threshold(0.0, 0.0, 0.0, 0.0, False)
    median = median_of_counts(d_diff)
    mad = float(_statsmodels_mad(counts, center=median))
    floor = margin * sample_size / k if k > 0 else 0.0
    mad_used = max(mad, floor)
    return Threshold(median, mad, mad_used, median + k * mad_used, mad < floor)


def median_of_counts(counts: np.ndarray) -> float:
    """np.median of non-negative integers, exactly, from their histogram (no O(N) partition)."""
    c = np.asarray(counts)
    n = c.size
    if n == 0:
        return float("nan")
    cum = np.cumsum(np.bincount(c.astype(np.int64, copy=False)))
    lo = int(np.searchsorted(cum, (n - 1) // 2, side="right"))
    hi = int(np.searchsorted(cum, n // 2, side="right"))
    return (lo + hi) / 2.0


def apply_rule(beta: np.ndarray, outside: np.ndarray, d_diff: np.ndarray, threshold: float,
               beta_min: float) -> tuple[np.ndarray, np.ndarray]:
    """The two tests per worker, each already combined with β > β_min.

    Returns (by_expectation, by_differential), both (N,) bool; the worker is abnormal if either holds.
    """
    busy = np.asarray(beta) > beta_min
    return busy & np.asarray(outside, dtype=bool), busy & (np.asarray(d_diff) > threshold)
