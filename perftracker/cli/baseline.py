"""`perftracker baseline`: each job's healthy baseline, and retaking it (issue 49, docs/baseline.md)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from perftracker.cli import output
from perftracker.cli.store_path import add_store_arguments, store_path
from perftracker.model.names import safe_text

HELP = "list the jobs' healthy baselines, or retake one"
DESCRIPTION = """List each job's healthy baseline: the window taken while the job ran at its normal speed, that
every later report is compared with ("since it was fast"). --retake JOB drops a job's baseline:
the next steady period of the job is taken as the new one (with PERFTRACKER_BASELINE=1 at the
localizer), or take it by hand while the job runs well: perftracker trigger --job JOB --reason baseline.
Reads (and with --retake writes) the localizer's sqlite store.

examples:
  perftracker baseline
  perftracker baseline --retake train-29500"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", nargs="?", default=None, help="only this job (default: every job)")
    p.add_argument("--retake", action="store_true", help="drop the job's baseline so that a new one is taken")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    add_store_arguments(p)


def run(args: argparse.Namespace) -> int:
    from perftracker.errors import UsageError
    from perftracker.localizer.store.sqlite_store import Store

    if args.retake and not args.job:
        raise UsageError("--retake needs the JOB whose baseline to drop")
    store = Store(store_path(args))
    try:
        if args.retake:
            n = store.baselines.forget(args.job)
            output.print_text(f"job {safe_text(args.job)}: baseline dropped ({n} rank(s))" if n else
                              f"job {safe_text(args.job)} has no baseline")
            return 0
        rows: list[dict[str, Any]] = [b.to_dict() for b in store.baselines.info(args.job)]
    finally:
        store.close()
    if args.format == "json":
        output.print_json(rows)
        return 0
    if not rows:
        output.print_text("no baseline")
        return 0
    now = time.time_ns()
    lines = [f"{'job':<32} {'session':<24} {'taken':>10} {'ranks':>6} {'KB':>7}"]
    for b in rows:
        age_h = (now - int(b["taken_ns"])) / 3.6e12
        lines.append(f"{safe_text(str(b['job']))[:32]:<32} {safe_text(str(b['session']))[:24]:<24} "
                     f"{age_h:>8.1f} h {b['ranks']:>6} {int(b['bytes']) / 1024:>7.1f}")
    output.print_text("\n".join(lines))
    return 0
