"""python -m bench.tracefault IN_DIR OUT_DIR [--fault KIND:RANKS:k=v,...] [--scenario FILE] [--steps K]"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from bench.tracefault.faults import KINDS, GpuFault
from bench.tracefault.mutate import mutate_dir
from perftracker.errors import PerftrackerError

DESCRIPTION = """\
Inject a known fault into a directory of per-rank Kineto traces (.json or .json.gz, one per rank)
and write a directory of valid Kineto traces in which the fault and its effect on the peers are
timed the way a synchronous job would run them.

The traces are re-timed with a dependency-respecting forward pass: events on one CUDA stream and on
one CPU process run in order; a kernel or copy starts no earlier than its launch (ac2g flow /
correlation id); a synchronizing runtime call ends no earlier than the GPU work it waits for; the
k-th NCCL kernel of a process group on every member rank is one collective instance, and all its
members end at the members' latest start plus the instance's transfer time (its shortest member
duration in the input). Without faults the output reproduces the input's timings.

fault kinds (--fault KIND:RANKS:PARAM=VALUE,...; RANKS like 2 or 1+6):
  slow_gpu:factor=F          the ranks' compute kernels take F times as long
  slow_link:factor=F         every collective the ranks join transfers F times as long
  host_stall:ms=M,before=N   the main thread stalls M ms before the first event named like N, each step
  slow_memcpy:factor=F       the ranks' GPU copies and memsets take F times as long
  gc_pause:ms=M,every=S      a pause of M ms on the main thread every S-th step, at a seeded-random op
  imbalance:factor=F,name=N  kernels named like N take F times as long on the ranks

examples:
  python -m bench.tracefault ../shared/data/dlrm_kineto /tmp/slow2 --fault slow_gpu:2:factor=12 --steps 4
  python -m bench.tracefault ../shared/data/dlrm_kineto /tmp/same            # identity: a re-timed copy
  python -m bench.tracefault IN OUT --scenario bench/gpu_scenarios/slow-gpu-r2.toml
The last stdout line is a JSON summary (events, identity share within 1 µs, step time in and out).
"""


def parse_fault(text: str) -> GpuFault:
    parts = text.split(":", 2)
    if len(parts) < 2 or parts[0] not in KINDS:
        raise argparse.ArgumentTypeError(f"--fault KIND:RANKS[:k=v,...], KIND one of {sorted(KINDS)}; got {text!r}")
    try:
        ranks = tuple(int(r) for r in parts[1].split("+"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fault {text!r}: RANKS must be integers joined by '+'") from None
    params: dict[str, object] = {}
    for kv in (parts[2].split(",") if len(parts) > 2 and parts[2] else []):
        k, _, v = kv.partition("=")
        spec = KINDS[parts[0]].get(k)
        if spec is None:
            raise argparse.ArgumentTypeError(f"--fault {text!r}: {parts[0]} takes {sorted(KINDS[parts[0]])}, not {k!r}")
        if spec is str:
            params[k] = v
        elif spec is int:
            params[k] = int(v)
        else:
            params[k] = float(v)
    try:
        return GpuFault(parts[0], ranks, params)
    except PerftrackerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tracefault", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("in_dir", type=Path, metavar="IN_DIR", help="directory of per-rank Kineto traces")
    p.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="where to write the mutated traces (same file names)")
    p.add_argument("--fault", type=parse_fault, action="append", default=[], metavar="KIND:RANKS:k=v,...",
                   help="a fault to inject (repeatable)")
    p.add_argument("--scenario", type=Path, default=None, metavar="FILE",
                   help="take faults, steps and seed from a bench/gpu_scenarios TOML file (its traces are ignored)")
    p.add_argument("--steps", type=int, default=None, help="tile the recorded step K times (default 1)")
    p.add_argument("--seed", type=int, default=None, help="seed for gc_pause's choice of ops (default 0)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    faults = list(args.fault)
    steps, seed = 1, 0
    try:
        if args.scenario is not None:
            from bench.tracefault.scenario import load_gpu_scenario

            sc = load_gpu_scenario(args.scenario, args.in_dir)
            faults += list(sc.faults)
            steps, seed = sc.steps, sc.seed
        steps = args.steps if args.steps is not None else steps
        seed = args.seed if args.seed is not None else seed
        res = mutate_dir(args.in_dir, args.out_dir, faults, steps, seed)
    except PerftrackerError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stderr.write(f"wrote {res.ranks} ranks to {args.out_dir}: {res.events} events, step {res.step_in_us / 1000:.2f} -> "
                     f"{res.step_out_us / 1000:.2f} ms ({res.slowdown:+.1%})\n")
    print(json.dumps({"ranks": res.ranks, "events": res.events, "steps": steps,
                      "identity_within_1us": round(res.identity_within_1us, 6),
                      "step_in_ms": round(res.step_in_us / 1000, 3), "step_out_ms": round(res.step_out_us / 1000, 3),
                      "slowdown": round(res.slowdown, 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
