"""localize(): all workers' patterns of a session -> a Report (docs/design.md section 6).

Per function f: the expected box R_f, D_exp (outside the box), P̂ = P / max, D_diff against one
seeded sample S of workers, the MAD threshold, and the rule. The abnormal workers of a function
become a finding; ``findings.py`` groups, labels and explains them.

``localize`` validates PatternSets and calls ``localize_arrays``; the same code path serves 8 and
1,000,000 workers.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localizer.arrays import FunctionInfo, PatternArrays, pattern_sets_to_arrays, validate_arrays
from localizer.distances import (
    differential_distance,
    differential_distance_blocks,
    exact_median,
    normalization_maxima,
    normalize_by_max,
    outside_expectation,
    sample_workers,
)
from localizer.expect import OPEN_BOX, Expectations, load_expectations
from localizer.findings import FunctionVerdict, build_findings
from localizer.host import with_host_total
from localizer.rule import apply_rule, differential_threshold
from localizer.waits import WaitOptions
from perftracker.model import PatternSet, Report

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalizeOptions:
    eps: float = 0.4  # L1 radius in the max-normalized pattern space
    k: float = 5.0  # MAD multiplier
    mad_floor_margin: float = 0.25  # degenerate MAD: threshold >= median + margin·|S| (rule.py)
    beta_min: float = 0.01  # a function must hold more than this share of the window
    material_difference: float = 0.01  # β: P̂ = P / max(max, this / eps): see distances.normalization_maxima
    material_utilization: float = 0.1  # μ and σ: see distances.normalization_maxima ("utilization")
    sample_size: int = 100  # |S| = min(N, sample_size)
    seed: int = 0  # seeds the sample S
    profile: str | None = None  # "gpu" | "cpu"; None: "gpu" if any worker saw GPU activity
    expect_path: str | None = None  # a user TOML file (--expect FILE); None: the built-in file
    expectations: Expectations | None = None  # already loaded; overrides profile / expect_path
    common_fraction: float = 0.5  # a finding on more than this share of the workers is "common"
    max_points: int = 500  # (rank, β, μ) points kept per finding for plots
    top_functions: int = 5
    grid_cells: int = 32  # cells per dimension of the exact D_diff grid (a power of two)
    refine_cells: int = 256  # second, finer grid for the workers the first leaves undecided
    method: str = "grid"  # "grid" (exact, fast) | "blocks" (the definition, full matrix)
    trigger_reason: str = ""
    created_ns: int | None = None  # None: now
    waits: WaitOptions = WaitOptions()  # who waits for whom (localizer/waits.py)


def localize(pattern_sets: Sequence[PatternSet], options: LocalizeOptions | None = None) -> Report:
    """Localize one session. Raises InputError on an empty set, duplicate ranks, mixed sessions
    or jobs, NaN or out-of-range values."""
    return localize_arrays(pattern_sets_to_arrays(pattern_sets), options)


def resolve_expectations(options: LocalizeOptions, gpu: bool) -> Expectations:
    if options.expectations is not None:
        return options.expectations
    profile = options.profile or ("gpu" if gpu else "cpu")
    return load_expectations(options.expect_path, profile)


def localize_arrays(arr: PatternArrays, options: LocalizeOptions | None = None) -> Report:
    """Localize one session held as arrays (see ``localizer.arrays``)."""
    opts = options or LocalizeOptions()
    if opts.method not in ("grid", "blocks"):
        raise ValueError(f"unknown D_diff method {opts.method!r}")
    t0 = time.perf_counter()
    validate_arrays(arr)
    expectations = resolve_expectations(opts, arr.gpu)
    sample = sample_workers(arr.n_workers, opts.sample_size, opts.seed)
    arr, host = with_host_total(arr)
    verdicts = [analyze_function(arr.values[f], info, expectations, sample, opts)
                for f, info in enumerate(arr.functions)]
    if host:
        verdicts = judge_host_ops_together(verdicts, host, arr)
    report = build_report(arr, verdicts, expectations, opts)
    log.info("localized %s/%s: %d workers x %d functions, %d finding(s) in %.2f s", arr.job, arr.session,
             arr.n_workers, len(arr.functions), len(report.findings), time.perf_counter() - t0)
    return report


def analyze_function(values: np.ndarray, info: FunctionInfo, expectations: Expectations,
                     sample: np.ndarray, opts: LocalizeOptions) -> FunctionVerdict:
    """The rule for one function over all workers. values: (3, N)."""
    rule = expectations.rule_for(info.key, info.label, info.category)
    box, hint = (rule.box, rule.hint) if rule is not None else (OPEN_BOX, "")
    beta = values[0]
    median_beta = exact_median(beta)
    if not (beta > opts.beta_min).any():  # the rule's first term fails everywhere: nothing to compute
        return FunctionVerdict(info, box, hint, median_beta, None, None, None,
                               rule is not None and rule.waits_for_peers)
    lo = np.array(box.lo.as_tuple())
    hi = np.array(box.hi.as_tuple())
    outside = outside_expectation(values, lo, hi)
    floor = material_floors(opts)
    if opts.method == "grid":  # P̂ = P / max is formed inside, only where it is needed
        maxima = normalization_maxima(values, floor)
        d_diff = differential_distance(values, sample, opts.eps, opts.grid_cells, opts.refine_cells, maxima)
    else:
        d_diff = differential_distance_blocks(normalize_by_max(values, floor), sample, opts.eps)
    threshold = differential_threshold(d_diff, opts.k, sample.size, opts.mad_floor_margin)
    by_exp, by_diff = apply_rule(beta, outside, d_diff, threshold.threshold, opts.beta_min)
    if rule is not None and rule.waits_for_peers:  # waiting longer than the others: a victim
        by_diff &= beta < median_beta
    if by_diff.any():  # ε-unique, and materially off the median worker in some dimension
        by_diff &= material_shift(values, floor)
    return FunctionVerdict(info, box, hint, median_beta, by_exp, by_diff, threshold,
                           rule is not None and rule.waits_for_peers)


def judge_host_ops_together(verdicts: list[FunctionVerdict], host: list[int], arr: PatternArrays
                            ) -> list[FunctionVerdict]:
    """Host ops of a GPU window are judged by their sum (``localizer.host``): one alone is outside
    expectation only when it alone exceeds the sum's expected share; the differential test stands."""
    total = verdicts[-1]
    bound = total.box.hi.beta
    out = list(verdicts)
    for f in host:
        v = verdicts[f]
        if v.by_expectation is not None:
            out[f] = dataclasses.replace(v, by_expectation=v.by_expectation & (arr.values[f, 0] > bound))
    return out


def material_shift(values: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """(N,) bool: the worker's pattern differs from the median worker's by at least the materiality
    floor (``material_floors``) in some dimension.

    **[decision]** D_diff counts how unique a worker is after P̂ = P / max, which stretches small
    differences when every worker's value is small: on a clean 4-rank CPU job, one Python frame at
    β = 0.011 (the median rank 0.010) with μ 0.44 against 0.34 was ε-far from all three other ranks.
    The floors already say what difference is material (0.01 / ε of the window in β, 0.1 / ε in μ
    and σ, since they cap how far P / max can stretch); a worker the test singles out must also be
    that far from the median worker in absolute terms somewhere. The paper's cases pass: a
    throttled kernel (β ×1.3, μ ×0.6), a PCIe copy at μ 0.7 against 0.06 at unchanged β.
    """
    med = np.array([exact_median(values[d]) for d in range(values.shape[0])])
    return (np.abs(values - med[:, None]) >= floor[:, None]).any(axis=0)


def material_floors(opts: LocalizeOptions) -> np.ndarray:
    """The per-dimension materiality floors (β, μ, σ) of P̂ (see distances.normalization_maxima)."""
    if opts.eps <= 0:
        return np.zeros(3)
    return np.array([opts.material_difference, opts.material_utilization, opts.material_utilization]) / opts.eps


def build_report(arr: PatternArrays, verdicts: Sequence[FunctionVerdict], expectations: Expectations,
                 opts: LocalizeOptions) -> Report:
    findings, summary, top = build_findings(arr, verdicts, opts)
    ranks_reported = arr.ranks if bool(np.all(arr.ranks[1:] > arr.ranks[:-1])) else np.sort(arr.ranks)
    missing: tuple[int, ...] = ()
    if arr.world_size > 0:
        present = np.zeros(arr.world_size, dtype=bool)
        present[ranks_reported[(ranks_reported >= 0) & (ranks_reported < arr.world_size)]] = True
        missing = tuple(np.flatnonzero(~present).tolist())
    keep_iter = {r for f in findings for r in f.ranks[:8]}
    keep_iter.update(sorted(arr.iteration_ms)[:8])
    return Report(
        job=arr.job, session=arr.session, kind="offline" if arr.offline else "slowdown",
        created_ns=time.time_ns() if opts.created_ns is None else opts.created_ns,
        trigger_reason=opts.trigger_reason, window_s=float(arr.window_s),
        ranks_reported=tuple(ranks_reported.tolist()), ranks_missing=missing,
        findings=tuple(findings), top_functions=tuple(top), summary=summary, profile=expectations.name,
        iteration_ms={r: tuple(arr.iteration_ms[r]) for r in sorted(keep_iter) if r in arr.iteration_ms},
        status="partial" if missing else "complete",
    )


__all__ = ["LocalizeOptions", "localize", "localize_arrays", "analyze_function", "resolve_expectations"]
