"""`perftracker analyze DIR`: summarize per-rank Kineto trace files offline, then localize.

Each rank's file is summarized in its own process (``agent.summarize.summarize_window`` on
``agent.kineto.read_kineto_trace``); progress goes to stderr. The PatternSets go through the same
localizer as online sessions, and the report is rendered as text, JSON or HTML.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TextIO

from perftracker.errors import InputError
from perftracker.model import PatternSet

HELP = "summarize and localize per-rank Kineto trace files offline"
DESCRIPTION = """\
Summarize per-rank Kineto trace files (.json or .json.gz, as torch.profiler exports them) into
behavior patterns, one process per rank, and run the localizer over all ranks.

Ranks come from each trace's distributedInfo; without it (or with --rank-from-filename) from the
file name (rank3.json, worker3.pt.trace.json.gz, ...). Offline there are no hardware samples, so
patterns carry β only (μ = σ = 0), and the localizer judges β.

examples:
  perftracker analyze traces/
  perftracker analyze traces/ --format html -o report.html
  perftracker analyze traces/ --patterns --format json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="directory of per-rank Kineto trace files")
    parser.add_argument("--format", choices=("text", "json", "html"), default="text", help="output format (default text)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    parser.add_argument("--expect", metavar="FILE", help="expected ranges (TOML) instead of the built-in profile")
    parser.add_argument("--rank-from-filename", action="store_true",
                        help="take each rank from its file name even when the trace has distributedInfo")
    parser.add_argument("--patterns", action="store_true", help="print the per-rank patterns instead of a report")
    parser.add_argument("-j", "--jobs", type=int, default=0, help="parallel processes (default: one per core)")


def trace_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory")
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))
    if not files:
        raise InputError(f"{directory}: no Kineto trace files (*.json, *.json.gz)")
    return files


def summarize_file(path: str, prefer_filename: bool, job: str) -> tuple[bytes, str]:
    """One rank, in a worker process: the PatternSet's compact bytes and where its rank came from."""
    from agent.kineto import load_trace_json, resolve_rank, window_from_trace
    from agent.summarize import summarize_window

    doc = load_trace_json(path)
    who = resolve_rank(doc, path, None, prefer_filename)
    raw = window_from_trace(doc, Path(path), who, job=job, session="offline")
    return summarize_window(raw).to_bytes(), who.source


def summarize_dir(directory: Path, prefer_filename: bool = False, jobs: int = 0,
                  progress: TextIO | None = None) -> list[PatternSet]:
    """All ranks' PatternSets, sorted by rank; InputError on duplicate ranks."""
    files = trace_files(directory)
    job = directory.resolve().name
    workers = max(1, min(len(files), jobs or (os.cpu_count() or 1)))
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    results: dict[Path, PatternSet] = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(summarize_file, str(f), prefer_filename, job): f for f in files}
        for done, fut in enumerate(as_completed(futures), 1):
            f = futures[fut]
            data, rank_source = fut.result()
            ps = PatternSet.from_bytes(data)
            results[f] = ps
            if progress is not None:
                note = "" if rank_source == "distributedInfo" else f" (rank taken from the {rank_source})"
                progress.write(f"[{done}/{len(files)}] rank {ps.rank}{note}: {f.name}: {len(ps.patterns)} functions, "
                               f"{len(data)} bytes\n")
                progress.flush()
    seen: dict[int, Path] = {}
    for f, ps in results.items():
        if ps.rank in seen:
            raise InputError(f"rank {ps.rank} appears twice: {seen[ps.rank]} and {f} "
                             "(use --rank-from-filename if the files are named by rank)")
        seen[ps.rank] = f
    world = max(len(files), max(seen) + 1)
    sets = [dataclasses.replace(ps, world_size=ps.world_size or world) for ps in results.values()]
    return sorted(sets, key=lambda p: p.rank)


def write_patterns(sets: list[PatternSet], fmt: str, out: TextIO) -> None:
    if fmt == "json":
        json.dump([ps.to_dict() for ps in sets], out, indent=1)
        out.write("\n")
        return
    for ps in sets:
        out.write(f"rank {ps.rank} ({ps.window_s * 1000:.1f} ms window, {len(ps.patterns)} functions)\n")
        for p in ps.patterns[:20]:
            out.write(f"  {p.category.value:<10} β={p.beta:.4f} μ={p.mu:.3f} σ={p.sigma:.3f}  {p.label[:90]}\n")


def run(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    sets = summarize_dir(directory, args.rank_from_filename, args.jobs, progress=sys.stderr)
    buf = io.StringIO()
    localize = None
    if not args.patterns:
        try:
            from localizer.localize import LocalizeOptions, localize
        except ImportError as exc:  # the localizer is an optional install
            sys.stderr.write(f"perftracker: localizer not available ({exc}); printing per-rank patterns\n")
    if localize is None:
        if args.format == "html":
            raise InputError("--patterns output is text or json, not html")
        write_patterns(sets, args.format, buf)
    else:
        from localizer.render import write

        report = localize(sets, LocalizeOptions(expect_path=args.expect, trigger_reason=f"offline: {directory}"))
        write(report, args.format, buf)
    if args.output:
        out = Path(args.output)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(buf.getvalue())
        tmp.replace(out)
        sys.stderr.write(f"wrote {out}\n")
    else:
        sys.stdout.write(buf.getvalue())
    return 0
