"""`perftracker sessions`: list profiling sessions."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from perftracker.cli import output
from perftracker.cli.trigger import DEFAULT_RUNS_DIR, add_connection_arguments, connect
from perftracker.errors import ConfigError, TransportError
from perftracker.model.names import safe_text

HELP = "list profiling sessions"
DESCRIPTION = """List sessions, oldest first: why each opened, its state, how many ranks uploaded and which
are missing. `perftracker report SESSION` shows one. Reads a running localizer (--url,
$PERFTRACKER_LOCALIZER_URL or the embedded one under --data-dir), or with --store (or when nothing
runs) the sqlite store itself. In a terminal each session is one line and the reason is cut to its
width; --format json has every field whole.

examples:
  perftracker sessions
  perftracker sessions --job demo --limit 5
  perftracker sessions --format json --url http://perftracker-localizer:8765
  perftracker sessions --store /var/lib/perftracker/localizer.sqlite"""


class _DeprecatedJson(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        output.warning("--json is deprecated; use --format json")
        namespace.format = "json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", default=None, help="only this job (default: every job)")
    p.add_argument("--store", default=None, metavar="PATH",
                   help="read this sqlite store file instead of a running localizer (default: the running one, "
                        "else <data-dir>/localizer.sqlite)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    p.add_argument("--json", action=_DeprecatedJson, nargs=0, help=argparse.SUPPRESS)  # before --format existed
    p.add_argument("--limit", type=_limit, default=50, help="newest N sessions (default %(default)s; 0: all)")
    add_connection_arguments(p)


def _limit(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0 or more; 0: all)")
    return n


def _from_store(path: Path, job: str | None) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(f"no localizer store at {path}: pass --store PATH or --url URL")
    from perftracker.localizer.store.sqlite_store import Store

    store = Store(path)
    try:
        return [s.to_dict() for s in store.sessions(job=job, limit=1_000_000)]
    finally:
        store.close()


def load_sessions(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.store:
        return _from_store(Path(args.store), args.job)
    runs = Path(args.runs_dir or DEFAULT_RUNS_DIR)
    store = runs / "localizer.sqlite"
    if args.url or os.environ.get("PERFTRACKER_LOCALIZER_URL"):
        return list(connect(args).list_sessions(args.job))
    if (runs / "localizer.json").is_file():  # an embedded localizer, unless it died
        try:
            return list(connect(args).list_sessions(args.job))
        except TransportError as exc:
            if getattr(exc, "status", 0) or not store.is_file():
                raise
    if runs.exists():  # the store of another user's (planted) runs dir is not read
        from perftracker.localizer.service.embedded import check_runs_dir

        check_runs_dir(runs)
    return _from_store(store, args.job)


def run(args: argparse.Namespace) -> int:
    rows = load_sessions(args)
    if args.limit:
        rows = rows[-args.limit:]
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
    names = ["session", "job", "kind", "state", "ranks", "opened", "missing / reason"]
    cells = [_row(s) for s in rows]
    widths = _widths(names, cells)
    if con.width - sum(widths) - 3 * len(widths) < _REASON_MIN:  # narrow: no kind, opened to the minute
        cells = [[*c[:2], *c[3:5], c[5][:-3], c[6]] for c in cells]
        del names[2]
        widths = _widths(names, cells)
    reason_w = max(12, con.width - sum(widths) - 3 * len(widths))
    for name, width in zip(names, [*widths, reason_w], strict=True):
        table.add_column(name, justify="right" if name == "ranks" else "left", no_wrap=True,
                         overflow="ellipsis", width=width)
    for s, c in zip(rows, cells, strict=True):
        table.add_row(*c, style=_STATE_STYLE.get(s["state"], ""))
    con.print(table)
    return 0


_STATE_STYLE = {"failed": "red", "open": "cyan", "localizing": "cyan"}
_REASON_MIN = 20


def _widths(names: list[str], cells: list[list[str]]) -> list[int]:
    """One line per session in the terminal: every column but the last (the reason) as wide as its
    widest cell, the job name at most 24; the reason gets what is left, cut with an ellipsis.
    Columns are 3 characters apart (padding and the box's blank rule)."""
    widths = [max(len(name), *(len(c[i]) for c in cells)) for i, name in enumerate(names[:-1])]
    widths[1] = min(widths[1], 24)
    return widths


def _ranges_text(s: dict[str, Any]) -> str:
    """The missing ranks of a listed session, from its first ranges ("0-3, 7, ..." past them)."""
    parts = [str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}" for lo, hi in s.get("missing_ranges", [])]
    return "[" + ", ".join(parts) + (", ..." if s.get("missing_more") else "") + "]"


def _row(s: dict[str, Any]) -> list[str]:
    opened = time.strftime("%m-%d %H:%M:%S", time.localtime(s["opened_ns"] / 1e9))
    ranks = f"{s['n_uploaded']}/{s['n_expected']}"  # a page lists counts, never the ranks themselves
    missing = f"missing {_ranges_text(s)}" if s["n_missing"] and s["state"] != "open" else ""
    note = s["error"] or missing or s["reason"]
    # names and reasons come from the network or the store: shown, never obeyed by the terminal
    return [safe_text(str(c)) for c in (s["session"], s["job"], s["kind"], s["state"], ranks, opened, note)]
