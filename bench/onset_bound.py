"""How fast can any detector catch an onset on this host? The changepoint rule against the bound.

Reads the per-rank iteration end times that ``examples/train.py --progress-dir`` writes
(``rank<R>.times``; ``bench/faults.py --keep`` keeps them beside each run), for example from

    python bench/faults.py --keep --scenario bench/scenarios/extra/clean-long.toml
    python bench/onset_bound.py /tmp/perftracker-faults-XXXX/clean-long-XXXX

On each rank's real series it injects a multiplicative step at many places and feeds the series to
``perftracker.slowdown.ChangepointRule`` (the detector's default rule), and it compares the delay
with Lorden's lower bound for any change detector: delay >= ln(ARL0) / (delta^2 / 2) for a mean shift
of delta noise sigmas (log iteration time) at one false alarm per ARL0 iterations.

Last stdout line: {"iterations": int, "noise_sigma": float, "clean_fires": int, "steps": {"0.28":
{"delta": float, "delay_median": int, "delay_p90": int, "delay_max": int, "missed": int,
"bound_arl10k": float}, ...}}
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perftracker.slowdown import ChangepointRule  # noqa: E402

log = logging.getLogger("onset_bound")


def load_series(run_dir: Path, skip: int) -> list[np.ndarray]:
    """Iteration durations (ns) per rank from ``rank<R>.times`` ("<iteration> <monotonic ns>")."""
    series = []
    for f in sorted(run_dir.glob("rank*.times")):
        try:
            a = np.loadtxt(f, dtype=np.int64, ndmin=2)
        except ValueError as exc:
            raise SystemExit(f"{f}: not an iteration-times file ({exc})") from None
        d = np.diff(a[:, 1])[skip:]
        if len(d) < 200:
            raise SystemExit(f"{f}: {len(d)} iterations after the first {skip}; need at least 200")
        series.append(d)
    if not series:
        raise SystemExit(f"{run_dir}: no rank*.times files (run bench/faults.py with --keep)")
    return series


def noise_sigma(d: np.ndarray) -> float:
    x = np.log(d)
    q1, q3 = np.percentile(x, [25, 75])
    return float((q3 - q1) / 1.349)


def delays(series: list[np.ndarray], step: float, every: int, warmup: int, tail: int) -> list[int | None]:
    out: list[int | None] = []
    for d in series:
        for onset in range(warmup, len(d) - tail, every):
            y = d.astype(np.float64)
            y[onset:] *= 1.0 + step
            rule = ChangepointRule()
            hit = None
            for i, v in enumerate(y.tolist()):
                if rule.observe(int(v)) is not None and i >= onset:
                    hit = i - onset + 1  # 1: fired on the first slow iteration
                    break
            out.append(hit)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a kept run's directory holding rank*.times")
    p.add_argument("--steps", default="0.15,0.28,0.4,0.65", help="relative step sizes, comma-separated")
    p.add_argument("--every", type=int, default=60, help="inject a step every this many iterations")
    p.add_argument("--skip", type=int, default=20, help="leading iterations to drop (start-up)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    series = load_series(args.run_dir, args.skip)
    sigma = float(np.median([noise_sigma(d) for d in series]))
    clean_fires = 0
    for d in series:
        rule = ChangepointRule()
        clean_fires += sum(rule.observe(int(v)) is not None for v in d.tolist())
    n = sum(len(d) for d in series)
    log.info("%d ranks, %d iterations; noise sigma %.3f (log); %d fires on the clean series", len(series), n,
             sigma, clean_fires)
    steps: dict[str, dict[str, float | int]] = {}
    for step in (float(s) for s in args.steps.split(",")):
        ds = delays(series, step, args.every, warmup=320, tail=150)
        hit = sorted(x for x in ds if x is not None)
        delta = math.log1p(step) / sigma
        bound = math.log(1e4) / (delta * delta / 2)
        row = {
            "delta": round(delta, 2),
            "delay_median": int(np.median(hit)) if hit else -1,
            "delay_p90": int(np.percentile(hit, 90)) if hit else -1,
            "delay_max": max(hit) if hit else -1,
            "missed": len(ds) - len(hit),
            "bound_arl10k": round(bound, 1),
        }
        steps[f"{step:g}"] = row
        log.info("step +%.0f%%: %.2f sigma; delay median %s, p90 %s, max %s, missed %d of %d; bound %.1f",
                 100 * step, delta, row["delay_median"], row["delay_p90"], row["delay_max"], row["missed"], len(ds),
                 bound)
    print(json.dumps({"iterations": n, "noise_sigma": round(sigma, 3), "clean_fires": clean_fires, "steps": steps}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
