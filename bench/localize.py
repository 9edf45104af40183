"""Localizer scale benchmark: N workers × 20 functions on one core, ours vs the obvious reference.

    python bench/localize.py --workers 1000000 [--quick]

Builds a simulated GPU job (bench.synthetic) with injected anomalies: throttled GEMM on 0.5% of
the workers, NVLink down on 6 hosts (48 workers, 3 of them with PCIe traffic), an injected sleep on
one rank and random GC pauses on 2% of the workers. Pins itself to core 0. In one run, on the same
arrays, it times ``localize_arrays`` (the entry point ``localize()`` itself calls after stacking
PatternSets), then the reference, then ours again; ``localize_s`` is the mean wall time of our two
runs. CPU times (process_time) and the load average are printed too, since the machine may be shared.

The reference is the obvious vectorized numpy implementation of the same definitions: for every
function D_exp as the full L1 distance to the box, P̂ = P / max(max, the profile's floor), the full
N × |S| matrix of L1 distances in blocks, np.median and statsmodels' MAD with the profile's margin
(or, for N <= 16, the per-N count over all workers and the minority check), the material-shift gate
with np.median, the rule. Its per-worker masks go through the
same finding builder, and the benchmark checks that the findings (and the masks) are identical.

It also times the PatternSet entry point ``localize()`` at ``--patternsets-workers`` (default
20,000), since building 1,000,000 Python PatternSet objects is not how the array path is used.

Last stdout line: {"workers", "localize_s", "speedup_vs_reference", "identical", "peak_rss_mb", ...}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time

import numpy as np
from perftracker.localizer.diagnose.localize import (
    analyze_function,
    localize,
    localize_arrays,
    resolve_expectations,
    resolve_floors,
    sample_for,
)
from perftracker.localizer.diagnose.method.arrays import PatternArrays
from perftracker.localizer.diagnose.method.expect import OPEN_BOX
from perftracker.localizer.diagnose.method.options import LocalizeOptions
from perftracker.localizer.diagnose.method.rule import (
    GAUSSIAN_3_4,  # statsmodels' constant, documented in rule.py
)
from perftracker.localizer.diagnose.verdict.findings import (
    FunctionVerdict,
    build_findings,
    report_summary,
)
from perftracker.localizer.diagnose.verdict.savings import replayed_savings, said
from perftracker.localizer.diagnose.words.headline import dress_report
from statsmodels.robust.scale import mad as statsmodels_mad

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: bench/ as a package
from bench import synthetic  # noqa: E402

BLOCK_ROWS = 100_000


def log(msg: str) -> None:
    print(f"[bench/localize] {msg}", file=sys.stderr, flush=True)


def build_job(n: int, seed: int) -> PatternArrays:
    arr = synthetic.simulate_job(n, seed=seed)
    rng = np.random.default_rng(seed + 1)
    throttled = np.sort(rng.choice(n, size=max(1, n // 200), replace=False))
    synthetic.inject_throttled_compute(arr, throttled)
    if n >= 96:
        hosts = np.arange(n // 2, n // 2 + 48)
        synthetic.inject_nvlink_down(arr, hosts, hosts[[3, 17, 40]])
    synthetic.inject_sleep(arr, int(rng.integers(n)))
    synthetic.inject_gc_pauses(arr, 0.02, seed=seed + 2)
    return arr


def reference_verdicts(arr: PatternArrays, opts: LocalizeOptions) -> list[FunctionVerdict]:
    """The definitions, computed the obvious way (full matrices in blocks, no shortcuts)."""
    expectations = resolve_expectations(opts, arr.gpu)
    floors = resolve_floors(opts, arr.gpu)  # the profile's numbers (localizer/diagnose/method/floors.py)
    n = arr.n_workers
    small = n <= opts.small_job_max
    if small:  # the exact test over all workers
        sample = np.arange(n)
    else:
        sample = np.sort(np.random.default_rng(opts.seed).choice(n, size=min(n, opts.sample_size), replace=False))
    m = sample.size
    out = []
    for f, info in enumerate(arr.functions):
        rule = expectations.rule_for(info.key, info.label, info.category)
        box, hint = (rule.box, rule.hint) if rule is not None else (OPEN_BOX, "")
        x = arr.values[f]
        lo = np.array(box.lo.as_tuple())[:, None]
        hi = np.array(box.hi.as_tuple())[:, None]
        d_exp = np.maximum(np.maximum(lo - x, x - hi), 0.0).sum(axis=0)
        mx = np.maximum(x.max(axis=1, keepdims=True), floors.normalization[:, None])  # materiality floors
        p = np.divide(x, mx, out=np.zeros_like(x), where=mx > 0)
        y = p[:, sample]
        d_diff = np.empty(n, dtype=np.int64)
        for start in range(0, n, BLOCK_ROWS):
            d = np.abs(p[:, start:start + BLOCK_ROWS, None] - y[:, None, :]).sum(axis=0)
            d_diff[start:start + BLOCK_ROWS] = (d > opts.eps).sum(axis=1)
        busy = x[0] > opts.beta_min
        by_exp = busy & (d_exp > 0)
        if small:  # ε-far from at least a share of the peers, and a minority of the job
            far = (d_diff >= np.ceil(opts.small_job_share * (n - 1) - 1e-9)) & (n >= 3)
            by_diff = busy & far & (2 * far.sum() < n)
        else:
            median = float(np.median(d_diff))
            mad = float(statsmodels_mad(d_diff.astype(np.float64), center=median))
            threshold = median + opts.k * max(mad, floors.mad_margin * m / opts.k)
            by_diff = busy & (d_diff > threshold)
        if rule is not None and rule.waits_for_peers:  # a victim waits longer than the others
            by_diff &= x[0] < np.median(x[0])
        dev = np.abs(x - np.median(x, axis=1, keepdims=True))
        material = dev >= floors.shift[:, None]
        if floors.shift_z > 0 and not small:  # the z part: the MAD test only
            material &= dev > floors.shift_z * (np.median(dev, axis=1, keepdims=True) / GAUSSIAN_3_4)
        by_diff &= material.any(axis=0)
        out.append(FunctionVerdict(info, box, hint, float(np.median(x[0])), by_exp, by_diff, None,
                                   rule is not None and rule.waits_for_peers))
    return out


def same_masks(ours: list[FunctionVerdict], ref: list[FunctionVerdict], n: int) -> bool:
    for a, b in zip(ours, ref, strict=True):
        ea = a.by_expectation if a.by_expectation is not None else np.zeros(n, dtype=bool)
        da = a.by_differential if a.by_differential is not None else np.zeros(n, dtype=bool)
        if not (np.array_equal(ea, b.by_expectation) and np.array_equal(da, b.by_differential)):
            log(f"masks differ for {a.info.label}")
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--patternsets-workers", type=int, default=20_000)
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="20,000 workers, no PatternSet entry: does it run")
    args = ap.parse_args()
    if args.quick:
        args.workers, args.patternsets_workers = min(args.workers, 20_000), 0

    os.sched_setaffinity(0, {args.core})
    log(f"pinned to core {args.core}; building {args.workers:,} workers x 20 functions")
    t = time.perf_counter()
    arr = build_job(args.workers, args.seed)
    log(f"built in {time.perf_counter() - t:.1f} s")
    opts = LocalizeOptions(seed=args.seed, created_ns=0)

    runs: list[float] = []
    cpu: list[float] = []
    t, c = time.perf_counter(), time.process_time()
    report = localize_arrays(arr, opts)
    runs.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
    log(f"ours (localize_arrays): {runs[-1]:.2f} s, {len(report.findings)} finding(s)")
    for fd in report.findings:
        log(f"  {fd.kind:8s} {len(fd.ranks):6d} ranks  {fd.sentence[:150]}")

    t, c = time.perf_counter(), time.process_time()
    ref_verdicts = reference_verdicts(arr, opts)
    ref_findings, ref_top = build_findings(arr, ref_verdicts, opts)
    ref_findings = said(arr, replayed_savings(arr, ref_findings))  # as build_report does
    ref_summary = report_summary(arr, ref_findings, ref_top)
    reference_s = time.perf_counter() - t
    reference_cpu_s = time.process_time() - c
    log(f"reference: {reference_s:.2f} s")

    t, c = time.perf_counter(), time.process_time()
    report2 = localize_arrays(arr, opts)
    runs.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
    log(f"ours again: {runs[-1]:.2f} s")

    expectations = resolve_expectations(opts, arr.gpu)
    floors = resolve_floors(opts, arr.gpu)
    sample = sample_for(arr.n_workers, opts)
    our_verdicts = [analyze_function(arr.values[f], info, expectations, sample, opts, floors)
                    for f, info in enumerate(arr.functions)]
    # localize_arrays dresses its findings (title, evidence, next steps: headline.dress_report, issue
    # 32); the reference's findings go through the same dressing before they are compared
    ref_dressed = dress_report(dataclasses.replace(report, findings=tuple(ref_findings)), arr.n_workers,
                               samples=not arr.offline).findings
    identical = (report.findings == ref_dressed and report.findings == report2.findings
                 and report.summary == ref_summary and same_masks(our_verdicts, ref_verdicts, arr.n_workers))
    localize_s = sum(runs) / len(runs)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    del arr, ref_verdicts, our_verdicts

    ps_n = args.patternsets_workers
    ps_s = ps_arrays_s = None
    if ps_n > 0:
        small = build_job(ps_n, args.seed)
        sets = synthetic.to_pattern_sets(small)
        t = time.perf_counter()
        r_sets = localize(sets, opts)
        ps_s = time.perf_counter() - t
        t = time.perf_counter()
        r_arrays = localize_arrays(small, opts)
        ps_arrays_s = time.perf_counter() - t
        log(f"PatternSet entry at {ps_n:,} workers: localize() {ps_s:.2f} s vs localize_arrays {ps_arrays_s:.2f} s; "
            f"same findings: {r_sets.findings == r_arrays.findings}")

    print(json.dumps({
        "workers": args.workers,
        "localize_s": round(localize_s, 3),
        "speedup_vs_reference": round(reference_s / localize_s, 2),
        "identical": bool(identical),
        "peak_rss_mb": round(peak_rss_mb, 1),
        "entry": "localize_arrays",
        "localize_runs_s": [round(x, 3) for x in runs],
        "reference_s": round(reference_s, 3),
        "localize_cpu_s": round(sum(cpu) / len(cpu), 3),
        "localize_cpu_runs_s": [round(x, 3) for x in cpu],
        "reference_cpu_s": round(reference_cpu_s, 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "functions": 20,
        "findings": len(report.findings),
        "patternsets_workers": ps_n,
        "patternsets_localize_s": None if ps_s is None else round(ps_s, 3),
        "patternsets_arrays_s": None if ps_arrays_s is None else round(ps_arrays_s, 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
