"""localize(): all workers' patterns of a session -> a Report (docs/design.md section 6).

Per function f: the expected box R_f, D_exp (outside the box), P̂ = P / max, D_diff against one
seeded sample S of workers, the MAD threshold (or, for jobs of at most 16 workers, the per-N count
of ``rule.small_job_threshold``), and the rule; the floors are per profile (``perftracker.localizer.diagnose.method.floors``).
The abnormal workers of a function become a finding; ``findings.py`` groups, labels and explains them.

``localize`` validates PatternSets and calls ``localize_arrays``; the same code path serves 8 and
1,000,000 workers.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import numpy as np
from perftracker.localizer.diagnose.evidence.host_bound import with_host_total, with_idle_share
from perftracker.localizer.diagnose.evidence.step_lanes import step_lanes
from perftracker.localizer.diagnose.method.arrays import (
    FunctionInfo,
    PatternArrays,
    pattern_sets_to_arrays,
    validate_arrays,
)
from perftracker.localizer.diagnose.method.distances import (
    differential_distance,
    differential_distance_blocks,
    exact_median,
    normalization_maxima,
    normalize_by_max,
    outside_expectation,
    sample_workers,
)
from perftracker.localizer.diagnose.method.expect import OPEN_BOX, Expectations, load_expectations
from perftracker.localizer.diagnose.method.floors import Floors, floors_for
from perftracker.localizer.diagnose.method.intsets import unique_ints
from perftracker.localizer.diagnose.method.options import LocalizeOptions
from perftracker.localizer.diagnose.method.rule import (
    GAUSSIAN_3_4,
    apply_rule,
    differential_threshold,
    minority_only,
    small_job_threshold,
)
from perftracker.localizer.diagnose.verdict.findings import (
    FunctionVerdict,
    build_findings,
    report_summary,
)
from perftracker.localizer.diagnose.verdict.ranking import rank
from perftracker.localizer.diagnose.verdict.savings import replayed_savings, said, together
from perftracker.localizer.diagnose.words.headline import dress_report

from perftracker.model import PatternSet, Report

log = logging.getLogger(__name__)


def localize(pattern_sets: Sequence[PatternSet], options: LocalizeOptions | None = None) -> Report:
    """Localize one session. Raises InputError on an empty set, duplicate ranks, mixed sessions
    or jobs, NaN or out-of-range values."""
    return localize_arrays(pattern_sets_to_arrays(pattern_sets), options)


def resolve_expectations(options: LocalizeOptions, gpu: bool) -> Expectations:
    if options.expectations is not None:
        return options.expectations
    profile = options.profile or ("gpu" if gpu else "cpu")
    return load_expectations(options.expect_path, profile)


def resolve_floors(options: LocalizeOptions, gpu: bool) -> Floors:
    """The floors of the job's profile ("gpu" if any worker saw GPU activity, unless
    ``options.profile`` says otherwise), with the options' overrides."""
    profile = options.profile or ("gpu" if gpu else "cpu")
    return floors_for(profile, options.eps, options.material_difference, options.material_utilization,
                      options.mad_floor_margin)


def sample_for(n_workers: int, options: LocalizeOptions) -> np.ndarray:
    """S: all workers for a small job (the exact test), else the seeded sample of ``sample_size``."""
    if n_workers <= options.small_job_max:
        return np.arange(n_workers, dtype=np.int64)
    return sample_workers(n_workers, options.sample_size, options.seed)


def localize_arrays(arr: PatternArrays, options: LocalizeOptions | None = None) -> Report:
    """Localize one session held as arrays (see ``perftracker.localizer.diagnose.method.arrays``)."""
    opts = options or LocalizeOptions()
    if opts.method not in ("grid", "blocks"):
        raise ValueError(f"unknown D_diff method {opts.method!r}")
    t0 = time.perf_counter()
    validate_arrays(arr)
    expectations = resolve_expectations(opts, arr.gpu)
    floors = resolve_floors(opts, arr.gpu)
    sample = sample_for(arr.n_workers, opts)
    arr, host = with_host_total(arr)
    stages = like_workers(arr.stage)
    if stages is None:
        verdicts = [analyze_function(arr.values[f], info, expectations, sample, opts, floors)
                    for f, info in enumerate(arr.functions)]
    else:
        verdicts = [analyze_by_stage(arr.values[f], info, expectations, stages, opts, floors)
                    for f, info in enumerate(arr.functions)]
    if host:
        verdicts = judge_host_ops_together(verdicts, host, arr)
    arr, idle = with_idle_share(arr)
    if idle is not None:  # a candidate cause of lateness only, never a finding by itself
        info = arr.functions[idle]
        verdicts.append(FunctionVerdict(info, OPEN_BOX, "", exact_median(arr.values[idle, 0]), None, None, None))
    report = build_report(arr, verdicts, expectations, opts)
    log.info("localized %s/%s: %d workers x %d functions, %d finding(s) in %.2f s", arr.job, arr.session,
             arr.n_workers, len(arr.functions), len(report.findings), time.perf_counter() - t0)
    return report


def analyze_function(values: np.ndarray, info: FunctionInfo, expectations: Expectations,
                     sample: np.ndarray, opts: LocalizeOptions, floors: Floors | None = None) -> FunctionVerdict:
    """The rule for one function over all workers. values: (3, N). floors: None: the profile's
    (``opts.profile``, else "gpu")."""
    if floors is None:
        floors = resolve_floors(opts, True)
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
    floor = floors.normalization
    if opts.method == "grid":  # P̂ = P / max is formed inside, only where it is needed
        maxima = normalization_maxima(values, floor)
        d_diff = differential_distance(values, sample, opts.eps, opts.grid_cells, opts.refine_cells, maxima)
    else:
        d_diff = differential_distance_blocks(normalize_by_max(values, floor), sample, opts.eps)
    n = values.shape[1]
    small = n <= opts.small_job_max
    if small:
        threshold = small_job_threshold(d_diff, opts.small_job_share)
    else:
        threshold = differential_threshold(d_diff, opts.k, sample.size, floors.mad_margin)
    by_exp, by_diff = apply_rule(beta, outside, d_diff, threshold.threshold, opts.beta_min)
    if small and by_diff.any():  # the ε-far workers must be a minority of the job
        by_diff &= minority_only(d_diff > threshold.threshold)
    if rule is not None and rule.waits_for_peers:  # waiting longer than the others: a victim
        by_diff &= beta < median_beta
    if by_diff.any():  # ε-unique, and materially off the median worker in some dimension
        by_diff &= material_shift(values, floors.shift, 0.0 if small else floors.shift_z)
    return FunctionVerdict(info, box, hint, median_beta, by_exp, by_diff, threshold,
                           rule is not None and rule.waits_for_peers)


def like_workers(stage: np.ndarray | None) -> list[np.ndarray] | None:
    """The worker columns of each pipeline stage, where at least two stages of at least two workers
    each are known (every worker in one), else None: the whole job is one population."""
    if stage is None or (stage < 0).any():
        return None
    parts = [np.flatnonzero(stage == s) for s in np.unique(stage)]
    return parts if len(parts) >= 2 and min(p.size for p in parts) >= 2 else None


def analyze_by_stage(values: np.ndarray, info: FunctionInfo, expectations: Expectations, stages: list[np.ndarray],
                     opts: LocalizeOptions, floors: Floors) -> FunctionVerdict:
    """The rule for one function, each pipeline stage judged on its own (issue 28: like with like).
    Stages run different layers: a worker of the heavier stage is not abnormal for computing what
    every worker of its stage computes, and a worker twice as slow as its own stage may still sit
    inside the spread of the whole job. The masks are the stages' masks put together; the median is
    the whole job's."""
    n = values.shape[1]
    by_exp = np.zeros(n, dtype=bool)
    by_diff = np.zeros(n, dtype=bool)
    first: FunctionVerdict | None = None
    for cols in stages:
        v = analyze_function(values[:, cols], info, expectations, sample_for(cols.size, opts), opts, floors)
        if v.by_expectation is None or v.by_differential is None:
            continue
        by_exp[cols] = v.by_expectation
        by_diff[cols] = v.by_differential
        first = first or v
    if first is None:  # no stage runs it above β_min: nor does the job (the rule's early exit)
        return analyze_function(values, info, expectations, sample_for(n, opts), opts, floors)
    return dataclasses.replace(first, median_beta=exact_median(values[0]), by_expectation=by_exp,
                               by_differential=by_diff)


def judge_host_ops_together(verdicts: list[FunctionVerdict], host: list[int], arr: PatternArrays
                            ) -> list[FunctionVerdict]:
    """Host ops of a GPU window are judged by their sum (``perftracker.localizer.diagnose.evidence.host_bound``): one alone is outside
    expectation only when it alone exceeds the sum's expected share; the differential test stands."""
    total = verdicts[-1]
    bound = total.box.hi.beta
    out = list(verdicts)
    for f in host:
        v = verdicts[f]
        if v.by_expectation is not None:
            out[f] = dataclasses.replace(v, by_expectation=v.by_expectation & (arr.values[f, 0] > bound))
    return out


def material_shift(values: np.ndarray, floor: np.ndarray, z: float = 0.0) -> np.ndarray:
    """(N,) bool: the worker's pattern differs from the median worker's by at least the shift gate
    (``Floors.shift``, per profile: ``perftracker.localizer.diagnose.method.floors``) in some dimension, and there (z > 0) by
    more than z robust standard deviations of the dimension, MAD / Φ⁻¹(3/4). The z part applies to
    jobs above ``small_job_max`` only (see ``perftracker.localizer.diagnose.method.floors``).

    **[decision]** D_diff counts how unique a worker is after P̂ = P / max, which stretches small
    differences when every worker's value is small: on a clean 4-rank CPU job, one Python frame at
    β = 0.011 (the median rank 0.010) with μ 0.44 against 0.34 was ε-far from all three other ranks.
    A worker the test singles out must also be materially far from the median worker in absolute
    terms somewhere. On the CPU profile the gate is the normalization floor itself (0.01 / ε of the
    window in β, 0.1 / ε in μ and σ), which that measurement set. On the GPU profile it is the
    materiality m itself (0.01 in β, 0.05 in μ and σ): the paper's GPU cases (a NIC collective at μ
    0.10 against 0.20, a σ of 0.25 against 0.06, a kernel only one rank runs at β 1.5%) differ by
    less than the CPU gate. Both pass a throttled kernel (β ×1.3, μ ×0.6) and a PCIe copy at μ 0.7
    against 0.06 at unchanged β.
    """
    out = np.zeros(values.shape[1], dtype=bool)
    for d in range(values.shape[0]):
        dev = np.abs(values[d] - exact_median(values[d]))
        ok = dev >= floor[d]
        if z > 0 and ok.any():
            ok &= dev > z * (exact_median(dev) / GAUSSIAN_3_4)
        out |= ok
    return out


MAX_LISTED_MISSING = 1_000_000  # a report names at most this many missing ranks (a claimed world size)


def _first_missing(present: np.ndarray, n: int) -> list[int]:
    """The ``n`` smallest non-negative ints not in ``present`` (sorted, unique)."""
    out: list[int] = []
    prev = -1
    for r in [*present.tolist(), None]:
        hi = prev + 1 + n if r is None else r
        out.extend(range(prev + 1, min(hi, prev + 1 + n - len(out))))
        if len(out) >= n or r is None:
            break
        prev = r
    return out


def build_report(arr: PatternArrays, verdicts: Sequence[FunctionVerdict], expectations: Expectations,
                 opts: LocalizeOptions) -> Report:
    findings, top = build_findings(arr, verdicts, opts)
    findings = replayed_savings(arr, findings)
    joint = together(arr, findings)  # before the sentences say each finding's saving
    findings = rank(said(arr, findings), opts.waits.wait_min)  # the saving known: one order (ranking.py)
    summary = report_summary(arr, findings, top)
    ranks_reported = arr.ranks if bool(np.all(arr.ranks[1:] > arr.ranks[:-1])) else np.sort(arr.ranks)
    missing: tuple[int, ...] = ()
    if arr.world_size > 0:  # sized by the ranks received, never by the world size they claim
        inside = unique_ints(ranks_reported[(ranks_reported >= 0) & (ranks_reported < arr.world_size)])
        n_missing = arr.world_size - inside.size
        if 0 < n_missing <= MAX_LISTED_MISSING:
            bounds = np.concatenate(([-1], inside, [arr.world_size]))
            missing = tuple(r for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
                            for r in range(lo + 1, hi))
        elif n_missing > 0:  # a claimed world far past the ranks received: the first ones are named
            missing = tuple(_first_missing(inside, MAX_LISTED_MISSING))
    keep_iter = {r for f in findings for r in f.ranks[:8]}
    keep_iter.update(sorted(arr.iteration_ms)[:8])
    report = Report(
        job=arr.job, session=arr.session, kind="offline" if arr.offline else "slowdown",
        created_ns=time.time_ns() if opts.created_ns is None else opts.created_ns,
        trigger_reason=opts.trigger_reason, window_s=float(arr.window_s),
        ranks_reported=tuple(ranks_reported.tolist()), ranks_missing=missing,
        findings=tuple(findings), top_functions=tuple(top), summary=summary, profile=expectations.name,
        iteration_ms={r: tuple(arr.iteration_ms[r]) for r in sorted(keep_iter) if r in arr.iteration_ms},
        status="partial" if missing else "complete", window_cost=dict(arr.window_cost),
        saves_together=joint,
    )
    report = dress_report(report, arr.n_workers, samples=not arr.offline)
    return dataclasses.replace(report, step_lanes=step_lanes(arr, report.findings))


__all__ = ["LocalizeOptions", "localize", "localize_arrays", "analyze_function", "resolve_expectations",
           "resolve_floors", "sample_for", "material_shift"]
