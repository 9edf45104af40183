"""`perftracker sessions`: list profiling sessions."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from perftracker.commands import output
from perftracker.commands.trigger import DEFAULT_RUNS_DIR, add_connection_arguments, connect
from perftracker.errors import ConfigError, TransportError

HELP = "list profiling sessions"
DESCRIPTION = """List sessions: state, uploads, missing ranks and report path. Reads a running localizer
(--url, $PERFTRACKER_LOCALIZER_URL or the embedded one under --runs-dir), or with --store (or when
nothing runs) the sqlite store itself."""


class _DeprecatedJson(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        output.warning("--json is deprecated; use --format json")
        namespace.format = "json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", default=None, help="only this job")
    p.add_argument("--store", default=None, help="read this sqlite store instead of a running localizer")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    p.add_argument("--json", action=_DeprecatedJson, nargs=0, help=argparse.SUPPRESS)  # before --format existed
    p.add_argument("--limit", type=int, default=50, help="newest N sessions (default %(default)s)")
    add_connection_arguments(p)


def _from_store(path: Path, job: str | None) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(f"no localizer store at {path}: pass --store PATH or --url URL")
    from localizer.store import Store

    store = Store(path)
    try:
        return [s.to_dict() for s in store.sessions(job=job, limit=1_000_000)]
    finally:
        store.close()


def load_sessions(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.store:
        return _from_store(Path(args.store), args.job)
    store = Path(args.runs_dir or DEFAULT_RUNS_DIR) / "localizer.sqlite"
    if args.url or os.environ.get("PERFTRACKER_LOCALIZER_URL"):
        return list(connect(args).list_sessions(args.job))
    if (Path(args.runs_dir) / "localizer.json").is_file():  # an embedded localizer, unless it died
        try:
            return list(connect(args).list_sessions(args.job))
        except TransportError as exc:
            if getattr(exc, "status", 0) or not store.is_file():
                raise
    return _from_store(store, args.job)


def run(args: argparse.Namespace) -> int:
    rows = load_sessions(args)[-args.limit:]
    if args.format == "json":
        output.print_json(rows)
        return 0
    if not rows:
        output.print_text("no sessions")
        return 0
    con = output.console()
    if con is None:
        for s in rows:
            output.print_text("  ".join(_row(s)))
        return 0
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("session", "job", "kind", "state", "ranks", "opened", "missing / reason"):
        table.add_column(name, justify="right" if name == "ranks" else "left",
                         overflow="fold", no_wrap=name in ("session", "opened"))
    for s in rows:
        table.add_row(*_row(s), style=_STATE_STYLE.get(s["state"], ""))
    con.print(table)
    return 0


_STATE_STYLE = {"failed": "red", "open": "cyan", "localizing": "cyan"}


def _row(s: dict[str, Any]) -> list[str]:
    opened = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["opened_ns"] / 1e9))
    ranks = f"{len(s['uploaded'])}/{len(s['expected'])}"
    missing = f"missing {s['missing']}" if s["missing"] and s["state"] != "open" else ""
    note = s["error"] or missing or s["reason"]
    return [s["session"], s["job"], s["kind"], s["state"], ranks, opened, note]
