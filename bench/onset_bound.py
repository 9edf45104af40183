"""How fast can any detector catch an onset on real iteration times? The detector's rule against the bound.

Reads per-rank iteration end times (``rank<R>.times``: "<step> <monotonic ns>" per line). With no
argument it reads the series shipped under ``bench/data/`` (one directory per job, recorded with
``bench/record_series.py``: the example job with 4 ranks on this 2-core host, the Hugging Face
Trainer and Lightning jobs of tests/framework_jobs/), so ``python bench/onset_bound.py`` reproduces
the figures in docs/detection-bound.md. A run directory kept by ``bench/faults.py --keep`` works too.

On each rank's real series it injects a multiplicative step (+10/20/40% by default) at many places
and feeds the series to ``perftracker.runtime.slowdown.ChangepointRule`` (the detector's default rule, as the
Detector feeds it), and compares the delay with Lorden's lower bound for any change detector:
delay >= ln(ARL0) / (delta^2 / 2) for a mean shift of delta noise sigmas (log iteration time, sigma
from the interquartile range) at one false alarm per ARL0 = 10,000 iterations. Past the end of a
series the recorded values continue from the start of its tested part (still slowed), so a late
onset is not cut short; an onset not found within ``--horizon`` iterations counts as missed (an
infinite delay in the medians).

False alarms: fires of the rule on each whole clean series, per 10,000 iterations.

Last stdout line: {"iterations": int, "false_per_10k": float, "clean_fires": int, "noise_sigma": float,
"delay_over_bound": {"0.1": float, ...}, "steps": {"0.1": {"delay_median": float, "bound_arl10k": float,
"delay_over_bound": float, "missed": int, "onsets": int, ...}, ...}, "by_series": [{"series": str,
"noise_sigma": float, "delay_over_bound": {...}, ...}, ...]}
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perftracker.runtime.slowdown import ChangepointRule  # noqa: E402

log = logging.getLogger("onset_bound")
DATA = Path(__file__).resolve().parent / "data"
ARL0 = 1e4
JOB_WIDE_SLACK = 10  # iterations: ranks of a synchronous job see the same slowdown within this


def load_series(run_dir: Path, skip: int) -> list[tuple[str, np.ndarray]]:
    """(name, iteration durations in ns) per rank from ``rank<R>.times``."""
    series = []
    for f in sorted(run_dir.glob("rank*.times")):
        try:
            a = np.loadtxt(f, dtype=np.int64, ndmin=2)
        except ValueError as exc:
            raise SystemExit(f"{f}: not an iteration-times file ({exc})") from None
        d = np.diff(a[:, 1])[skip:]
        if len(d) < 200:
            raise SystemExit(f"{f}: {len(d)} iterations after the first {skip}; need at least 200")
        series.append((f"{run_dir.name}/{f.stem}", d))
    if not series:
        raise SystemExit(f"{run_dir}: no rank*.times files (bench/record_series.py, or bench/faults.py --keep)")
    return series


def noise_sigma(d: np.ndarray) -> float:
    x = np.log(d)
    q1, q3 = np.percentile(x, [25, 75])
    return float((q3 - q1) / 1.349)


def bound(step: float, sigma: float) -> float:
    delta = math.log1p(step) / sigma
    return math.log(ARL0) / (delta * delta / 2)


def clean_pass(d: np.ndarray, onsets: list[int]) -> tuple[list[int], dict[int, ChangepointRule]]:
    """Iterations where the rule fires on the clean series, and its state just before each onset."""
    rule = ChangepointRule()
    states: dict[int, ChangepointRule] = {}
    want = set(onsets)
    fires = []
    for i, v in enumerate(d.tolist()):
        if i in want:
            states[i] = copy.deepcopy(rule)
        if rule.observe(int(v)) is not None:
            fires.append(i)
    return fires, states


def job_wide(fires: dict[str, list[int]], name: str, i: int, slack: int = JOB_WIDE_SLACK) -> bool:
    """A fire of series ``name`` at iteration ``i`` that every other rank of the same job (the
    same directory, same step numbering) also fired within ``slack`` iterations of: the whole job
    slowed down (the recorded host got busier), a real slowdown rather than one rank's noise."""
    job = name.split("/")[0]
    others = [f for n, f in fires.items() if n != name and n.split("/")[0] == job]
    return bool(others) and all(any(abs(j - i) <= slack for j in f) for f in others)


def delay_after(rule: ChangepointRule, d: np.ndarray, onset: int, warmup: int, step: float,
                horizon: int) -> int | None:
    """Iterations from the onset to the rule's first fire (1: on the first slow one), None if missed."""
    tested = d[warmup:]
    for j in range(horizon):
        i = onset + j
        v = d[i] if i < len(d) else tested[(i - len(d)) % len(tested)]
        if rule.observe(int(v * (1.0 + step))) is not None:
            return j + 1
    return None


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else math.inf


def _finite(x: float) -> float | None:
    """JSON has no infinity: a median past the misses is null."""
    return None if math.isinf(x) else round(x, 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", type=Path, nargs="*", help="directories holding rank*.times (default: bench/data/*)")
    p.add_argument("--steps", default="0.1,0.2,0.4", help="relative step sizes, comma-separated")
    p.add_argument("--every", type=int, default=40, help="inject a step every this many iterations")
    p.add_argument("--skip", type=int, default=20, help="leading iterations to drop (start-up)")
    p.add_argument("--warmup", type=int, default=320, help="first onset (the rule's reference fills first)")
    p.add_argument("--horizon", type=int, default=2000, help="iterations after an onset before it counts as missed")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    dirs = args.run_dirs or sorted(x for x in DATA.iterdir() if x.is_dir() and any(x.glob("rank*.times")))
    if not dirs:
        raise SystemExit(f"no series: pass a directory, or record some under {DATA}")
    series = [s for d in dirs for s in load_series(d, args.skip)]
    steps = [float(s) for s in args.steps.split(",")]

    n_total = fires_total = 0
    ratios: dict[float, list[float]] = {s: [] for s in steps}
    delays: dict[float, list[float]] = {s: [] for s in steps}
    bounds: dict[float, list[float]] = {s: [] for s in steps}
    missed = {s: 0 for s in steps}
    by_series: list[dict[str, object]] = []
    fired: dict[str, list[int]] = {}
    for name, d in series:
        sigma = noise_sigma(d)
        onsets = list(range(args.warmup, len(d) - 1, args.every))
        fires, states = clean_pass(d, onsets)
        fired[name] = fires
        n_total += len(d)
        fires_total += len(fires)
        row: dict[str, object] = {"series": name, "iterations": len(d), "noise_sigma": round(sigma, 3),
                                  "clean_fires": len(fires), "fired_at": fires}
        per: dict[str, float] = {}
        for step in steps:
            b = bound(step, sigma)
            got = [delay_after(copy.deepcopy(states[o]), d, o, args.warmup, step, args.horizon) for o in onsets]
            ds = [float(x) if x is not None else math.inf for x in got]
            delays[step] += ds
            ratios[step] += [x / b for x in ds]
            bounds[step].append(b)
            missed[step] += sum(x is None for x in got)
            per[f"{step:g}"] = _finite(_median(ds) / b)  # type: ignore[assignment]
        row["delay_over_bound"] = per
        by_series.append(row)
        log.info("%-28s %5d it  sigma %.3f  clean fires %s  delay/bound %s", name, len(d), sigma, fires,
                 "  ".join(f"+{100 * s:.0f}%: {per[f'{s:g}']}" for s in steps))

    out_steps: dict[str, dict[str, float | int | None]] = {}
    for step in steps:
        hit = sorted(x for x in delays[step] if x < math.inf)
        out_steps[f"{step:g}"] = {
            "delay_median": _finite(_median(delays[step])),
            "delay_p90": _finite(float(np.percentile(delays[step], 90))) if delays[step] else None,
            "bound_arl10k_median": round(float(np.median(bounds[step])), 1),
            "delay_over_bound": _finite(_median(ratios[step])),
            "missed": missed[step],
            "onsets": len(delays[step]),
            "delay_max_found": max(hit) if hit else -1,
        }
        o = out_steps[f"{step:g}"]
        log.info("step +%.0f%%: delay median %s (bound median %s), delay/bound median %s, missed %d of %d",
                 100 * step, o["delay_median"], o["bound_arl10k_median"], o["delay_over_bound"], missed[step],
                 len(delays[step]))
    wide = sum(job_wide(fired, name, i) for name, f in fired.items() for i in f)
    for row in by_series:
        row["job_wide_fires"] = sum(job_wide(fired, str(row["series"]), i) for i in fired[str(row["series"])])
    log.info("clean fires: %d in %d iterations (%.2f per 10k); %d of them job-wide (every rank of the job "
             "within %d iterations), %d on one rank's series alone (%.2f per 10k)", fires_total, n_total,
             fires_total / n_total * 1e4, wide, JOB_WIDE_SLACK, fires_total - wide,
             (fires_total - wide) / n_total * 1e4)
    result = {
        "iterations": n_total,
        "clean_fires": fires_total,
        "false_per_10k": round(fires_total / n_total * 1e4, 3),
        "job_wide_fires": wide,
        "rank_specific_false_per_10k": round((fires_total - wide) / n_total * 1e4, 3),
        "noise_sigma": round(float(np.median([noise_sigma(d) for _, d in series])), 3),
        "delay_over_bound": {k: v["delay_over_bound"] for k, v in out_steps.items()},
        "steps": out_steps,
        "by_series": by_series,
        "sources": [str(d) for d in dirs],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
