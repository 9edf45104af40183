"""False-positive and detection rates of the differential test per job size N, on synthetic jobs.

    python bench/localize_small_n.py                 # N = 2, 3, 4, 8, 16, 32, 100; 1,000 jobs each
    python bench/localize_small_n.py --jobs 200 --sizes 8 16

Clean jobs come from ``bench.synthetic.simulate_job`` (its per-worker noise levels), seeded
0..jobs-1 per N, in three variants: ``online`` (μ and σ as sampled), ``offline`` (a trace without
hardware samples: μ = σ = 0), and ``noisy`` (online with twice the per-worker variation of every
kernel, copy and collective, a stress beyond the synthetic job's levels). A job is a false positive
if its report (``localize_arrays``, the whole pipeline) names any rank. ``paper`` is the paper's
rule as written (P̂ = P / max with no floors, D_diff over all workers up to |S| = 100, median +
5·MAD, β > 1%) on the same online jobs: the share of jobs where it flags some rank of some function.

Detection: one rank (seed mod N) of an otherwise clean online job is slowed with
``synthetic.inject_throttled_compute`` (its GEMM takes longer, the others wait for it in the
AllReduce): ``β×1.3 μ×0.7`` (a throttled GPU) and ``β×1.15`` (15% slower at the same utilization).
``found`` is the share of jobs whose report names the slowed rank (by any test, including the wait
evidence of ``perftracker.localizer.diagnose.evidence.waits``); ``alone`` the share that names it and no other rank; ``diff`` the
share where a finding of the differential test names it. ``offline β×2`` is the same on offline jobs with the GEMM twice as long (β
alone must differ by more than 1 / (1 − ε) = 1.67× to be ε-far).

Prints a table, then one JSON line: {"jobs", "sizes", "rates": {N: {column: rate}}, "elapsed_s"}.
Results are deterministic for given --jobs and --sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np
from perftracker.localizer.diagnose.localize import localize_arrays
from perftracker.localizer.diagnose.method.arrays import PatternArrays
from perftracker.localizer.diagnose.method.distances import (
    differential_distance_blocks,
    normalize_by_max,
    sample_workers,
)
from perftracker.localizer.diagnose.method.options import LocalizeOptions
from statsmodels.robust.scale import mad as statsmodels_mad

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: bench/ as a package
from bench import synthetic as sy  # noqa: E402

OPTS = LocalizeOptions(created_ns=0)
NOISY = tuple(dataclasses.replace(f, beta_cv=2 * f.beta_cv, mu_cv=2 * f.mu_cv, sigma_cv=2 * f.sigma_cv)
              if f.category is not sy.Category.PYTHON else f for f in sy.GPU_FUNCTIONS)
DETECT_SEED = 1_000_000
CASES = (("b1.3_mu0.7", 1.3, 0.7, False), ("b1.15", 1.15, 1.0, False), ("offline_b2", 2.0, 1.0, True))
SHOW = {"b1.3_mu0.7": "β×1.3 μ×.7", "b1.15": "β×1.15", "offline_b2": "off β×2"}
COLUMNS = ("fp_online", "fp_offline", "fp_noisy", "paper_fp_online") + tuple(
    f"{kind}_{case[0]}" for case in CASES for kind in ("found", "alone", "diff"))


def log(msg: str) -> None:
    print(f"[bench/localize_small_n] {msg}", file=sys.stderr, flush=True)


def job(n: int, seed: int, variant: str = "online") -> PatternArrays:
    arr = sy.simulate_job(n, seed=seed, functions=NOISY if variant == "noisy" else sy.GPU_FUNCTIONS)
    if variant == "offline":
        arr.values[:, 1:, :] = 0.0
    return arr


def named_ranks(arr: PatternArrays) -> tuple[set[int], set[int]]:
    """(ranks any finding names, ranks a finding of the differential test names)."""
    findings = localize_arrays(arr, OPTS).findings
    return ({r for f in findings for r in f.ranks},
            {r for f in findings if "differential" in f.tests for r in f.ranks})


def paper_flags(arr: PatternArrays, beta_min: float = 0.01, k: float = 5.0, eps: float = 0.4) -> bool:
    """Whether the paper's rule as written flags any worker of any function."""
    sample = sample_workers(arr.n_workers, 100, 0)
    for f in range(len(arr.functions)):
        v = arr.values[f]
        busy = v[0] > beta_min
        if not busy.any():
            continue
        d = differential_distance_blocks(normalize_by_max(v), sample, eps)
        med = float(np.median(d))
        if (busy & (d > med + k * float(statsmodels_mad(d.astype(np.float64), center=med)))).any():
            return True
    return False


def slowed(n: int, seed: int, beta_factor: float, mu_factor: float, offline: bool = False) -> tuple[PatternArrays, int]:
    arr = job(n, DETECT_SEED + seed)
    rank = seed % n
    sy.inject_throttled_compute(arr, np.array([rank]), beta_factor=beta_factor, mu_factor=mu_factor)
    if offline:
        arr.values[:, 1:, :] = 0.0
    return arr, rank


def rates(n: int, jobs: int) -> dict[str, float]:
    counts = dict.fromkeys(COLUMNS, 0)
    for seed in range(jobs):
        for variant in ("online", "offline", "noisy"):
            arr = job(n, seed, variant)
            counts[f"fp_{variant}"] += bool(named_ranks(arr)[0])
            if variant == "online":
                counts["paper_fp_online"] += paper_flags(arr)
        for name, bf, mf, off in CASES:
            arr, rank = slowed(n, seed, bf, mf, off)
            named, by_diff = named_ranks(arr)
            counts[f"found_{name}"] += rank in named
            counts[f"alone_{name}"] += named == {rank}
            counts[f"diff_{name}"] += rank in by_diff
    return {c: round(counts[c] / jobs, 4) for c in COLUMNS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000, help="seeded jobs per N and variant")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4, 8, 16, 32, 100])
    args = ap.parse_args()
    t0 = time.perf_counter()
    table: dict[int, dict[str, float]] = {}
    short = ("N", "fp on", "fp off", "fp 2×", "paper fp") + tuple(
        f"{SHOW[case[0]]} {kind}" for case in CASES for kind in ("found", "alone", "diff"))
    print(" ".join(f"{h:>8s}" for h in short[:5]) + " " + " ".join(f"{h:>16s}" for h in short[5:]))
    for n in args.sizes:
        t = time.perf_counter()
        table[n] = rates(n, args.jobs)
        print(f"{n:>8d} " + " ".join(f"{table[n][c]:>8.3f}" for c in COLUMNS[:4]) + " "
              + " ".join(f"{table[n][c]:>16.3f}" for c in COLUMNS[4:]), flush=True)
        log(f"N={n}: {args.jobs} jobs per variant in {time.perf_counter() - t:.1f} s")
    print(json.dumps({"jobs": args.jobs, "sizes": args.sizes, "rates": {str(n): r for n, r in table.items()},
                      "elapsed_s": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
