"""The rule: f on w is abnormal if β > β_min ∧ (D_exp > 0 ∨ D_diff > median + k·MAD).

The MAD is statsmodels' definition (``statsmodels.robust.scale.mad``: the median absolute deviation
divided by Φ⁻¹(3/4) ≈ 0.6745, so that it estimates σ for normal data), computed with numpy
(``scaled_mad``) so that the embedded localizer runs on the base install; tests/unit/test_rule.py checks
it against statsmodels itself where that is installed (docs/compatibility.md says why).

**[decision] Degenerate MAD.** D_diff is a count of sampled workers, an integer in [0, |S|]. When
more than half of the workers share one count (the usual case for a healthy job, where nearly every
worker is within ε of nearly every other and D_diff is 0), the MAD is 0 and the bare rule would flag
any worker that is farther than ε from a single sampled worker: one noisy worker out of 1,000 makes
a finding. We floor the (scaled) MAD at ``margin · |S| / k``, so that the threshold is never below
median + margin·|S|: a worker is abnormal by the differential test only if it is farther than ε from
a share ``margin`` of the sampled workers more than the typical worker is. This is scale-free and
keeps what the test is for: a group of a share g of the workers that differs from the rest has
D_diff ≈ (1 − g)·|S| against a median of about g·|S|, so every group below (1 − margin) / 2 of the
job clears it. The margin is per profile (``perftracker.localizer.diagnose.method.floors``): 0.25 on CPU jobs (groups below
37.5%), 0.1 on GPU jobs (below 45%, so the paper's 40% case is found). A first version floored the
raw MAD at one count (|S|/100); on a clean synthetic job the tail workers reached 9–13 of 100 before
the materiality floors existed, which that floor flagged. The floor acts only when the counts really
do not spread; otherwise the paper's median + k·MAD stands.

**[decision] Small jobs (3 ≤ N ≤ 16).** D_diff is a count in [0, N − 1], and one count of spread
gives a scaled MAD of 1.48, so k·MAD = 7.4 counts: with 8 ranks no single rank could pass (D_diff at
most 7 against a threshold of 7.2 or more). For N ≤ ``small_job_max`` the differential test is
instead exact over all peers (S = all workers) with a per-N count: a worker is abnormal if it is
farther than ε from at least ``share`` of its N − 1 peers, c(N) = ⌈share·(N − 1)⌉, and only while
the workers so flagged are a minority (fewer than N / 2; a job split in halves does not say which
half is abnormal). share = 0.75: c(3) = 2, c(4) = 3, c(8) = 6, c(16) = 12, so a lone rank stays
detectable when noise puts one peer near it (N ≥ 6), and groups up to a quarter of the job are
found. At N = 2 the distance is symmetric (each rank is as far from the other), so the test cannot
say which rank differs and flags nothing; who waits for whom (the wait evidence) decides there.
False-positive and detection rates per N on clean and faulty synthetic jobs: bench/localize_small_n.py,
docs/localizer-rule.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GAUSSIAN_3_4 = 0.6744897501960817  # Φ⁻¹(3/4), statsmodels' default normalization constant


@dataclass(frozen=True)
class Threshold:
    """The differential threshold of one function and how it came about."""

    median: float
    mad: float  # statsmodels' (scaled) MAD of D_diff
    mad_used: float  # after the degenerate-MAD floor
    threshold: float  # median + k · mad_used; small jobs: c(N) − 0.5 (D_diff > threshold ⟺ D_diff ≥ c)
    floored: bool
    method: str = "mad"  # "mad" (the paper's, with the floor) | "small_job" (per-N count) | "none" (N < 3)


DEFAULT_MARGIN = 0.25  # the floor's share of |S|, see the module doc


def differential_threshold(d_diff: np.ndarray, k: float, sample_size: int,
                           margin: float = DEFAULT_MARGIN) -> Threshold:
    """median + k·MAD over all workers' D_diff, with the degenerate-MAD floor (see the module doc)."""
    counts = np.asarray(d_diff, dtype=np.float64)
    if counts.size == 0:
        return Threshold(0.0, 0.0, 0.0, 0.0, False)
    median = median_of_counts(d_diff)
    mad = scaled_mad(counts, median)
    floor = margin * sample_size / k if k > 0 else 0.0
    mad_used = max(mad, floor)
    return Threshold(median, mad, mad_used, median + k * mad_used, mad < floor)


def small_job_count(n_workers: int, share: float) -> int:
    """c(N) = ⌈share·(N − 1)⌉: how many of its N − 1 peers a worker must be ε-far from (module doc)."""
    return int(np.ceil(share * (n_workers - 1) - 1e-9))


def small_job_threshold(d_diff: np.ndarray, share: float) -> Threshold:
    """The small-job test's threshold: D_diff ≥ c(N) over all N workers; nothing at N < 3."""
    counts = np.asarray(d_diff)
    n = counts.size
    median = median_of_counts(counts) if n else 0.0
    if n < 3:
        return Threshold(median, 0.0, 0.0, float("inf"), False, "none")
    return Threshold(median, 0.0, 0.0, small_job_count(n, share) - 0.5, False, "small_job")


def minority_only(flagged: np.ndarray) -> np.ndarray:
    """The flagged mask if fewer than half of the workers are flagged, else none (small jobs)."""
    mask = np.asarray(flagged, dtype=bool)
    return mask if 2 * int(np.count_nonzero(mask)) < mask.size else np.zeros_like(mask)


def scaled_mad(values: np.ndarray, center: float) -> float:
    """statsmodels.robust.scale.mad(values, center=center): median(|x - center|) / Φ⁻¹(3/4)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return 0.0
    return float(np.median(np.abs(x - center)) / GAUSSIAN_3_4)


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
