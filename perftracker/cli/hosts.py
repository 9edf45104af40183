"""`perftracker hosts`: the hosts that keep being named as the culprit, across sessions and jobs (issue 49)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from perftracker.cli import output
from perftracker.cli.store_path import add_store_arguments, store_path
from perftracker.model.names import safe_text

HELP = "list the hosts that reports keep naming as the culprit"
DESCRIPTION = """List the hosts the localizer's reports named as the culprit (the hosts of a finding's ranks,
where the finding is specific to some ranks; a hang's culprit ranks), across sessions and jobs,
the most named first. A host is FLAGGED (worth draining) only when reports of at least
--min-sessions different sessions named it within --days: one bad report never flags a host.
Reads the localizer's sqlite store (--store, or <data-dir>/localizer.sqlite).

examples:
  perftracker hosts
  perftracker hosts --days 1 --min-sessions 2 --format json
  perftracker hosts --store /var/lib/perftracker/localizer.sqlite"""


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            v = 0
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
        return v
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--days", type=_positive(float), default=7.0, help="look back this many days (default %(default)s)")
    p.add_argument("--min-sessions", type=_positive(int), default=3,
                   help="sessions that must name a host before it is flagged (default %(default)s)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    add_store_arguments(p)


def load_hosts(args: argparse.Namespace) -> list[dict[str, Any]]:
    from perftracker.localizer.store.sqlite_store import Store

    store = Store(store_path(args))
    try:
        return [h.to_dict() for h in store.culprits.hosts(time.time_ns(), args.days * 86400.0, args.min_sessions)]
    finally:
        store.close()


def run(args: argparse.Namespace) -> int:
    rows = load_hosts(args)
    if args.format == "json":
        output.print_json({"min_sessions": args.min_sessions, "days": args.days, "hosts": rows})
        return 0
    if not rows:
        output.print_text(f"no host was named as the culprit in the last {args.days:g} days")
        return 0
    lines = [f"{'host':<24} {'sessions':>8} {'jobs':>5}  flagged  causes"]
    for h in rows:
        causes = ", ".join(f"{c} {n}" for c, n in h["causes"])
        lines.append(f"{safe_text(h['host'])[:24]:<24} {h['sessions']:>8} {h['jobs']:>5}  "
                     f"{'FLAGGED' if h['flagged'] else '-':<7}  {safe_text(causes)}")
    lines.append(f"flagged: named by reports of at least {args.min_sessions} sessions in the last {args.days:g} days")
    output.print_text("\n".join(lines))
    return 0
