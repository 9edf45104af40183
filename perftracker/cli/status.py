"""`perftracker status`: the state of the jobs on this node: their newest sessions (the embedded
localizer's store), the triggers held until worth a window, what the profile windows cost and the
budget left."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from perftracker.cli import output
from perftracker.cli.options import add_data_dir
from perftracker.model.names import safe_text

HELP = "show the jobs' state on this node: newest sessions, held triggers, window costs and the budget left"
DESCRIPTION = """The newest sessions of the embedded localizer under --data-dir (state, ranks uploaded,
reason; `perftracker sessions` lists them all), then, per training process on this node (each rank keeps its own ledger under the run dir's
budget/): the windows of the last hour (how many were manual), the training time the last one
cost, measured online from iteration times before, during and after it ("partial" when the
process ended first: measured to its exit), what the windows spent over the trailing hour against
what they may spend (PERFTRACKER_WINDOW_BUDGET, 2 % of the training time in that hour, or
PERFTRACKER_WINDOW_BUDGET_INITIAL_S, 10 s, while that is more), what is left, and how many of the
detector's triggers the budget refused. Manual `perftracker trigger` windows are never refused;
they are counted.

examples:
  perftracker status
  perftracker status --run-dir /tmp/perftracker-1000 --format json   # the ledgers only"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", default=None, metavar="DIR",
                   help="the run dir the workers use (default: $PERFTRACKER_RUN_DIR, else /tmp/perftracker-<uid>)")
    add_data_dir(p, "the embedded localizer's directory, whose sessions are shown")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="output format (default: text); json: the ledgers (`perftracker sessions --format json`: "
                        "the sessions)")


SESSIONS_SHOWN = 5


def session_lines(runs_dir: Path, n: int = SESSIONS_SHOWN) -> list[str]:
    """The newest ``n`` sessions of the store under ``runs_dir``, one line each ([] without a store;
    a store that cannot be read is one warning)."""
    store_path = runs_dir / "localizer.sqlite"
    if not store_path.is_file():
        return []
    try:
        from perftracker.localizer.store.sqlite_store import Store

        store = Store(store_path)
        try:
            rows = [s.to_dict() for s in store.sessions(limit=1_000_000)][-n:]
        finally:
            store.close()
    except Exception as exc:  # noqa: BLE001 - the budget lines below still show
        output.warning(f"{safe_text(str(store_path))}: sessions not read ({safe_text(str(exc))[:200]})")
        return []
    return [safe_text(f"{s['session']}  {s['job']}  {s['kind']}  {s['state']}  "
                      f"{s['n_uploaded']}/{s['n_expected']} ranks  {s['error'] or s['reason']}") for s in rows]


def load_ledgers(run_dir: Path) -> list[dict[str, Any]]:
    """Every rank's ledger; a file that cannot be read is one warning, the others are kept."""
    rows = []
    for path in sorted((run_dir / "budget").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or not isinstance(data.get("budget"), dict):
                raise ValueError("not a window-cost ledger")
        except (OSError, ValueError) as exc:
            output.warning(f"{safe_text(str(path))}: {safe_text(str(exc))[:200]}; skipped")
            continue
        rows.append({"ledger": path.stem, **data})
    return rows


def _line(row: dict[str, Any]) -> str:
    b = row["budget"]
    last = b.get("last_window_lost_s")
    windows = row.get("windows")
    partial = bool(windows and isinstance(windows[-1], dict) and windows[-1].get("partial"))
    age_s = time.time() - float(row.get("written_unix_s") or 0.0)
    allowed = float(b.get("allowance_s", b.get("limit_s", 0)))  # older ledgers: the hour's limit
    trained = b.get("trained_s")
    basis = ""
    if isinstance(trained, (int, float)):
        initial = f", initial {float(b.get('initial_s', 0)):g} s" if "initial_s" in b else ""
        basis = f" ({100 * float(b.get('fraction', 0)):g} % of {float(trained):.0f} s trained{initial})"
    return (f"{safe_text(row['ledger'])}: {b.get('windows', 0)} window(s) in the last hour "
            f"({b.get('manual_windows', 0)} manual), last cost "
            f"{'-' if last is None else f'{float(last):.2f} s'}{' partial (to the exit)' if partial else ''}"
            f"{' (' + safe_text(str(b.get('last_window_session')))[:40] + ')' if b.get('last_window_session') else ''}, "
            f"spent {float(b.get('spent_s', 0)):.2f} s of {allowed:.2f} s allowed{basis}, "
            f"left {float(b.get('left_s', 0)):.2f} s, refused {b.get('refused', 0)}{_held_text(row)} "
            f"(as of {age_s:.0f} s ago)")


def _held_text(row: dict[str, Any]) -> str:
    """Triggers held until worth a window (window_cost.WindowCostMeter.deferral); '' for older ledgers."""
    h = row.get("held_triggers")
    if not isinstance(h, dict):
        return ""
    def n(key: str) -> int:
        v = h.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) < 1e12 else 0

    return (f", held until worth a window: {n('sent_late')} sent later, {n('passed')} let go (the job was "
            f"back to speed), {n('covered')} covered by another window, {n('expired')} expired"
            f"{', 1 held now' if h.get('held') is True else ''}")


def run(args: argparse.Namespace) -> int:
    from perftracker.config import Config

    run_dir = Path(args.run_dir or Config.from_env().run_dir)
    rows = load_ledgers(run_dir)
    if args.format == "json":
        output.print_json(rows)
        return 0
    runs_dir = getattr(args, "runs_dir", None)
    sessions = session_lines(Path(runs_dir)) if runs_dir else []
    if sessions:
        output.print_text(f"newest sessions under {safe_text(str(runs_dir))} (`perftracker sessions` for all):")
        for line in sessions:
            output.print_text("  " + line)
    elif runs_dir:
        output.print_text(f"no sessions recorded under {safe_text(str(runs_dir))}")
    if not rows:
        output.print_text(f"no profile-window costs recorded under {safe_text(str(run_dir / 'budget'))}")
        return 0
    for row in rows:
        output.print_text(_line(row))
    return 0
