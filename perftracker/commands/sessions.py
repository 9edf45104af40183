"""`perftracker sessions`: list profiling sessions."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from perftracker.commands.trigger import DEFAULT_RUNS_DIR, add_connection_arguments, connect, say
from perftracker.errors import ConfigError, TransportError

HELP = "list profiling sessions"
DESCRIPTION = """List sessions: state, uploads, missing ranks and report path. Reads a running localizer
(--url, $PERFTRACKER_LOCALIZER_URL or the embedded one under --runs-dir), or with --store (or when
nothing runs) the sqlite store itself."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", default=None, help="only this job")
    p.add_argument("--store", default=None, help="read this sqlite store instead of a running localizer")
    p.add_argument("--json", action="store_true", help="print JSON")
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
    if args.json:
        say(json.dumps(rows, indent=2))
        return 0
    if not rows:
        say("no sessions")
        return 0
    head = f"{'SESSION':24} {'JOB':16} {'KIND':8} {'STATE':10} {'RANKS':>9} {'OPENED':19} MISSING / REASON"
    say(head)
    for s in rows:
        opened = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["opened_ns"] / 1e9))
        ranks = f"{len(s['uploaded'])}/{len(s['expected'])}"
        missing = f"missing {s['missing']}" if s["missing"] and s["state"] != "open" else ""
        note = s["error"] or missing or s["reason"]
        say(f"{s['session']:24} {s['job'][:16]:16} {s['kind']:8} {s['state']:10} {ranks:>9} {opened:19} {note}")
    return 0
