"""`perftracker analyze PATH`: summarize per-rank Kineto trace files offline, then localize.

Each rank's file is read once and summarized in its own process (``perftracker.cli.analyze_rank``:
``perftracker.agent.summarize.summarizer.summarize_window`` on ``perftracker.agent.kineto.window_from_trace``);
progress goes to stderr. A file that cannot be read or is no
Kineto trace is skipped with a one-line warning, and its rank (when its name says it) is listed in
the report's ``ranks_missing``; ``--strict`` makes it an error. The PatternSets go through the same
localizer as online sessions, and the report is rendered as text, JSON or HTML.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from perftracker.cli import output
from perftracker.cli.analyze_rank import FileSummary, summarize_file, summarize_kept
from perftracker.cli.formats import add_format_options, resolve_format
from perftracker.errors import InputError, PerftrackerError, UsageError
from perftracker.model import PatternSet
from perftracker.model.names import safe_text

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from perftracker.agent.summarize.step_align import Cut
    from perftracker.model import Report

HELP = "summarize and localize per-rank Kineto trace files offline"
DESCRIPTION = """\
Summarize per-rank Kineto trace files (.json or .json.gz, as torch.profiler exports them) into
behavior patterns, one process per rank, and run the localizer over all ranks.

PATH is a directory or one trace file. In a directory, every *.pt.trace.json[.gz] below it (the
layout torch.profiler.tensorboard_trace_handler writes, subdirectories included) and every
*.json[.gz] directly in it is read. A file that is unreadable or no Kineto trace is skipped with a
warning and its rank listed as missing; --strict fails instead. So is a file of more than
$PERFTRACKER_TRACE_MAX_BYTES of JSON (after decompression; default 256 MiB), and one whose times,
durations or ranks are not finite or out of range.

Traces from torch 1.8 on are read. A trace whose bytes are not valid UTF-8, or whose events lack
a duration, is read with a warning that says so.

Ranks come from each trace's distributedInfo; without it (or with --rank-from-filename) from the
file name: rank3 or worker3 (rank_3, worker-3, ...) before any other number, so node1_rank3 is
rank 3. A single trace without either takes --rank. Several traces of one rank from one process
(torch.profiler's schedule with repeat > 1) keep the latest, with a warning; from different
processes, or overlapping in time, they are an error. Hardware samples beside a trace
(rank3.json.gz -> rank3.samples.npz, the agent's own sample format) give μ and σ; a trace without
them carries β only (μ = σ = 0). --ranks-per-host N (ranks fill hosts in order) lets each
collective be measured against its link: NVLink or PCIe inside a host, the NIC between hosts.

examples:
  perftracker analyze traces/
  perftracker analyze traces/ --brief
  perftracker analyze traces/ -o report.html          # the suffix sets the format
  perftracker analyze traces/ --patterns --format json
  perftracker analyze my_trace.json --rank 0
"""

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="PATH", help="directory of per-rank Kineto trace files, or one trace file")
    add_format_options(parser)
    parser.add_argument("--expect", metavar="FILE", help="expected ranges (TOML) instead of the built-in profile (default: built in)")
    parser.add_argument("--rank-from-filename", action="store_true",
                        help="take each rank from its file name even when the trace has distributedInfo")
    parser.add_argument("--rank", type=int, default=None, metavar="R",
                        help="the rank of a single trace file (when it has no distributedInfo)")
    parser.add_argument("--strict", action="store_true",
                        help="fail on any unreadable or unrelated file instead of skipping it")
    parser.add_argument("--ranks-per-host", type=int, default=0, metavar="N",
                        help="ranks per host, filled in order (default: unknown; collectives use NVLink, else the NIC)")
    parser.add_argument("--patterns", action="store_true", help="print the per-rank patterns instead of a report")
    parser.add_argument("-j", "--jobs", type=int, default=0, help="parallel processes (default: one per core)")


def trace_files(path: Path) -> list[Path]:
    """The trace files of ``path``: itself when a file; else every *.pt.trace.json[.gz] below it
    and every *.json[.gz] directly in it."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"{path}: no such file or directory")
    found = {p for p in path.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz"))}
    found.update(p for p in _walk_files(path) if p.name.endswith(TRACE_SUFFIXES))
    files = sorted(found)
    if not files:
        raise InputError(f"{path}: no Kineto trace files (*.pt.trace.json[.gz] in any subdirectory, "
                         "*.json[.gz] in it)")
    return files


def _walk_files(top: Path) -> list[Path]:
    """The regular files below ``top``, with a stack instead of recursion (issue 46: ``rglob`` of a
    directory 1,500 levels deep raised RecursionError); symlinked directories are not followed."""
    out: list[Path] = []
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(Path(e.path))
                        elif e.is_file():
                            out.append(Path(e.path))
                    except OSError:
                        continue
        except OSError:
            continue
    return out


MAX_SKIP_WARNINGS = 20  # files skipped past this are counted in one line, not one warning each


@dataclass
class Summaries:
    """What ``summarize_dir`` read: the ranks' PatternSets, sorted by rank, the files it skipped
    (path, one-line reason, the rank its name gives or None) and what the step alignment cut ('':
    nothing; ``_aligned``)."""

    sets: list[PatternSet]
    skipped: list[tuple[Path, str, int | None]] = field(default_factory=list)
    aligned: str = ""

    @property
    def ranks_skipped(self) -> list[int]:
        return sorted({r for _, _, r in self.skipped if r is not None} - {ps.rank for ps in self.sets})


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if isinstance(exc, PerftrackerError) else f"{type(exc).__name__}: {text}"


def summarize_dir(directory: Path, prefer_filename: bool = False, jobs: int = 0,
                  progress: Callable[[str], None] | None = None, rank: int | None = None,
                  strict: bool = False, warn: Callable[[str], None] | None = None,
                  ranks_per_host: int = 0) -> Summaries:
    """All readable ranks' PatternSets, sorted by rank. An unreadable or unrelated file is skipped
    (one line through ``warn``; InputError with ``strict``); InputError on duplicate ranks or
    when no file could be read. The first pass keeps each rank's window in a scratch directory
    (``analyze_rank``) for the later passes, the step alignment's cut and the gloo groups; it is
    removed on return. Without one (no writable temporary directory) they read their files again."""
    files = trace_files(directory)
    try:
        tmp = tempfile.TemporaryDirectory(prefix="perftracker-analyze-")
    except OSError as exc:
        log.info("no scratch directory (%s): a cut or gloo groups read their traces again", exc)
        return _summarize_dir(directory, files, None, prefer_filename, jobs, progress, rank, strict, warn,
                              ranks_per_host)
    with tmp as scratch:
        return _summarize_dir(directory, files, Path(scratch), prefer_filename, jobs, progress, rank, strict, warn,
                              ranks_per_host)


def _summarize_dir(directory: Path, files: list[Path], scratch: Path | None, prefer_filename: bool, jobs: int,
                   progress: Callable[[str], None] | None, rank: int | None, strict: bool,
                   warn: Callable[[str], None] | None, ranks_per_host: int) -> Summaries:
    from perftracker.agent.kineto import rank_from_filename
    from perftracker.cli.gloo_offline import enabled as gloo_enabled

    if rank is not None and len(files) > 1:
        raise InputError(f"--rank names the rank of one trace file; {directory} holds {len(files)}")
    job = (directory.parent if directory.is_file() else directory).resolve().name
    workers = max(1, min(len(files), jobs or (os.cpu_count() or 1)))
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    results: dict[Path, PatternSet] = {}
    firsts: dict[Path, FileSummary] = {}
    skipped: list[tuple[Path, str, int | None]] = []
    several = len(files) > 1  # one rank has nothing to be aligned with, nor gloo peers
    gloo = several and gloo_enabled()
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(summarize_file, str(f), prefer_filename, job, rank, ranks_per_host,
                               str(scratch / f"{i}.npz") if several and scratch is not None else "", gloo): f
                   for i, f in enumerate(files)}
        for done, fut in enumerate(as_completed(futures), 1):
            f = futures[fut]
            try:
                first = firsts[f] = fut.result()
            except Exception as exc:  # noqa: BLE001 - one bad file among many is a warning
                reason = _reason(exc)
                if strict:
                    raise InputError(f"{reason} (--strict)") from None
                named = rank_from_filename(f)
                skipped.append((f, reason, named))
                if warn is not None and len(skipped) <= MAX_SKIP_WARNINGS:
                    who = f"rank {named} missing" if named is not None else "no rank in its name"
                    warn(f"[{done}/{len(files)}] skipped {f} ({who}): {reason.removeprefix(str(f) + ': ')}")
                continue
            ps = PatternSet.from_bytes(first.data)
            first.data = b""  # held in results
            results[f] = ps
            for why in first.dropped:
                log.warning("%s: %s", f, why)
            for note in first.notes:
                if warn is not None:
                    warn(f"[{done}/{len(files)}] {f}: {note.removeprefix(str(f) + ': ')}")
            if progress is not None:
                note = "" if first.rank_source == "distributedInfo" else f" (rank taken from the {first.rank_source})"
                progress(f"[{done}/{len(files)}] rank {ps.rank}{note}: {f.name}: {len(ps.patterns)} functions")
    if warn is not None and len(skipped) > MAX_SKIP_WARNINGS:  # issue 46: 20,000 empty files, 20,000 lines
        warn(f"{len(skipped) - MAX_SKIP_WARNINGS} more file(s) skipped (--strict names the first; "
             f"the report lists the missing ranks)")
    if not results:
        raise InputError(f"{directory}: none of the {len(files)} file(s) is a readable Kineto trace")
    for f, reason in _earlier_cycles(results):
        del results[f]
        skipped.append((f, reason, None))
        if warn is not None:
            warn(f"{f}: {reason}")
    cuts, aligned = _aligned(results, firsts, prefer_filename, job, rank, ranks_per_host, warn, jobs)
    _with_gloo_groups(results, firsts, prefer_filename, job, rank, ranks_per_host, warn, cuts)
    seen = {ps.rank: f for f, ps in results.items()}
    named_ranks = [r for _, _, r in skipped if r is not None]
    world = max(len(results), max([*seen, *named_ranks]) + 1)
    sets = [dataclasses.replace(ps, world_size=max(ps.world_size, world)) for ps in results.values()]
    return Summaries(sorted(sets, key=lambda p: p.rank), skipped, aligned)


def _aligned(results: dict[Path, PatternSet], firsts: dict[Path, FileSummary], prefer_filename: bool, job: str,
             rank: int | None, ranks_per_host: int, warn: Callable[[str], None] | None, jobs: int = 0
             ) -> tuple[dict[int, Cut], str]:
    """Every rank cut to the work all ranks recorded (``perftracker.agent.summarize.step_align``):
    the ranks that recorded more are summarized again over the common steps, in place; what was
    cut, or why nothing could be, is one warning. Each is summarized from the window its first pass
    kept (``firsts``), not read again. A rank whose cut fails keeps its whole window
    (warned). The cuts applied, by rank, and the alignment's note."""
    from perftracker.agent.summarize.step_align import plan_cuts

    plan = plan_cuts([firsts[f].marks for f in results if f in firsts])
    if plan.usual:  # nothing to check (most multi-host traces): said at -v, not on every report
        log.info("%s", plan.note)
        return {}, ""
    if plan.note and warn is not None:
        warn(plan.note)
    applied: dict[int, Cut] = {}
    todo = {f: plan.by_rank[ps.rank] for f, ps in results.items() if ps.rank in plan.by_rank}
    if not todo:
        return applied, plan.note
    workers = max(1, min(len(todo), jobs or (os.cpu_count() or 1)))
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(summarize_kept, firsts[f].kept, str(f), prefer_filename, job, rank, ranks_per_host,
                               None, cut): f
                   for f, cut in todo.items()}
        for fut in as_completed(futures):
            f = futures[fut]
            try:
                data = fut.result()
            except Exception as exc:  # noqa: BLE001 - the whole window stands
                if warn is not None:
                    warn(f"{f}: not cut to the common steps, whole window kept ({_reason(exc)})")
                continue
            results[f] = PatternSet.from_bytes(data)
            applied[results[f].rank] = todo[f]
    return applied, plan.note


def _with_gloo_groups(results: dict[Path, PatternSet], firsts: dict[Path, FileSummary], prefer_filename: bool,
                      job: str, rank: int | None,
                      ranks_per_host: int, warn: Callable[[str], None] | None,
                      cuts: dict[int, Cut] | None = None) -> None:
    """A CPU gloo job's traces list their groups but name none on a collective (torch 2.13): each
    rank whose gloo calls (read by its first pass, ``firsts``) get a group
    (``perftracker.cli.gloo_offline``) is summarized again with them from the window that pass kept,
    in place; the calls left without one are said in one warning (issue 28). Off unless
    PERFTRACKER_GLOO_GROUPS=1 (``gloo_offline.ENV``: on a host with fewer cores than ranks it turned
    CPU contention into per-group findings, docs/diagnosis.md)."""
    from perftracker.cli.gloo_offline import enabled

    todo = {ps.rank: f for f, ps in results.items() if ps.groups and not ps.comm} if enabled() else {}
    if len(todo) < 2:
        return
    from perftracker.cli.gloo_offline import gloo_assignments

    calls = {r: firsts[f].gloo for r, f in todo.items() if f in firsts}
    assigned, unassigned = gloo_assignments({r: c for r, c in calls.items() if c is not None})
    if unassigned and warn is not None:
        warn(f"gloo: {len(unassigned)} rank/call pairs have no process group ({unassigned[0]}"
             + (", ..." if len(unassigned) > 1 else "") + ")")
    for f, ps in list(results.items()):
        if ps.rank in assigned and todo.get(ps.rank) == f:
            try:
                data = summarize_kept(firsts[f].kept, str(f), prefer_filename, job, rank, ranks_per_host,
                                      assigned[ps.rank], (cuts or {}).get(ps.rank))
            except Exception as exc:  # noqa: BLE001 - the first summary stands
                if warn is not None:
                    warn(f"{f}: gloo groups not applied ({_reason(exc)})")
                continue
            results[f] = PatternSet.from_bytes(data)


def _earlier_cycles(results: dict[Path, PatternSet]) -> list[tuple[Path, str]]:
    """The files to drop when several traces hold one rank: torch.profiler's schedule with
    ``repeat`` > 1 writes one trace per cycle and rank (``tensorboard_trace_handler``: same worker
    name, new time stamp): one process, windows one after the other. The latest cycle is kept, each
    earlier one listed with why. InputError when the rank's traces come from different processes,
    overlap in time or have names that give different ranks: two processes claim one rank (traces
    recorded before init_process_group, two runs in one directory), and no choice would be right."""
    from perftracker.agent.kineto import rank_from_filename

    by_rank: dict[int, list[tuple[Path, PatternSet]]] = {}
    for f, ps in results.items():
        by_rank.setdefault(ps.rank, []).append((f, ps))
    dropped: list[tuple[Path, str]] = []
    for rank, items in sorted(by_rank.items()):
        if len(items) == 1:
            continue
        items.sort(key=lambda it: (it[1].window_start_ns, str(it[0])))
        named = {rank_from_filename(f) for f, _ in items} - {None}
        pids = sorted({ps.pid for _, ps in items})
        overlap = next(((a, b) for a, b in zip(items, items[1:], strict=False) if b[1].window_start_ns < a[1].window_end_ns), None)
        if overlap is not None or len(named) > 1 or len(pids) > 1:
            a, b = overlap or items[:2]
            why = ("their names give different ranks" if len(named) > 1 else
                   f"two processes (pids {', '.join(map(str, pids))})" if len(pids) > 1 else
                   "their windows overlap in time")
            hint = (" (use --rank-from-filename: the file names give the ranks)" if len(named) == len(items)
                    else " (point analyze at one job's traces)")
            raise InputError(f"rank {rank} appears twice: {a[0]} and {b[0]}; {why}{hint}")
        kept = items[-1][0]
        dropped += [(f, f"an earlier profiling cycle of rank {rank}, skipped (kept the latest, {kept.name})")
                    for f, _ in items[:-1]]
    return dropped


def write_patterns(sets: list[PatternSet], fmt: str, out: TextIO, width: int = 80) -> None:
    if fmt == "json":
        json.dump([ps.to_dict() for ps in sets], out, indent=1)
        out.write("\n")
        return
    label_w = max(20, width - 43)
    for ps in sets:
        out.write(f"rank {ps.rank} ({ps.window_s * 1000:.1f} ms window, {len(ps.patterns)} functions)\n")
        for p in ps.patterns[:20]:
            label = safe_text(p.label)[:label_w]  # a trace's names: shown, never obeyed by the terminal
            out.write(f"  {p.category.value:<10} β={p.beta:.4f} μ={p.mu:.3f} σ={p.sigma:.3f}  {label}\n")


def localize_summaries(summ: Summaries, directory: Path, expect: str | None = None) -> Report:
    """The report `perftracker analyze DIR` renders for what summarize_dir read (bench/gpu_faults.py
    calls summarize_dir and this, so the bench scores exactly what the command prints)."""
    from perftracker.localizer.diagnose.localize import localize
    from perftracker.localizer.diagnose.method.options import LocalizeOptions

    trigger = f"offline: {directory}" + (f"; {summ.aligned}" if summ.aligned else "")  # the cut, in the report
    report = localize(summ.sets, LocalizeOptions(expect_path=expect, trigger_reason=trigger))
    if summ.ranks_skipped:
        missing = tuple(sorted(set(report.ranks_missing) | set(summ.ranks_skipped)))
        report = dataclasses.replace(report, ranks_missing=missing)
    return report


def run(args: argparse.Namespace) -> int:
    from perftracker.agent.kineto import trace_max_bytes

    trace_max_bytes()  # a bad PERFTRACKER_TRACE_MAX_BYTES: one error now, not one per file
    resolve_format(args)  # -o's suffix sets the format; options that disagree: one line, exit 2
    if args.patterns and args.brief:
        raise UsageError("--brief shortens a report; --patterns prints no report: leave out one of them")
    if args.output:
        output.check_writable(args.output)
    localize: Callable[..., object] | None = None  # None: print per-rank patterns
    if not args.patterns:
        try:
            from perftracker.localizer.diagnose.localize import localize
        except ImportError as exc:  # the localizer is an optional install
            output.warning(f"localizer not available ({exc}); printing per-rank patterns")
    if localize is None and args.format == "html":
        raise UsageError("--patterns output is text or json, not html")
    directory = Path(args.dir)
    err = output.console(stderr=True)
    summ = summarize_dir(directory, args.rank_from_filename, args.jobs, rank=args.rank, strict=args.strict,
                         progress=(lambda line: err.print(line, overflow="fold")) if err else output.message,
                         warn=output.warning, ranks_per_host=max(args.ranks_per_host, 0))
    sets = summ.sets
    con = None if args.output else output.console()
    if localize is None:
        width = con.width if con is not None else 80
        render: Callable[[TextIO], None] = lambda fh: write_patterns(sets, args.format, fh, width)  # noqa: E731
    else:
        from perftracker.localizer.render import write

        report = localize_summaries(summ, directory, args.expect)

        def render(fh: TextIO) -> None:
            if getattr(args, "brief", False):
                from perftracker.localizer.render.facts import brief_lines

                fh.write(safe_text("\n".join(brief_lines(report)), newlines=True) + "\n")
            elif args.format == "text" and fh is sys.stdout and con is not None:
                write(report, "text", fh, console=con)
            else:
                write(report, args.format, fh)
    if args.output:
        out = output.write_file(args.output, render)
        output.message(f"wrote {out}")
    else:
        render(sys.stdout)
    if summ.skipped:
        output.warning(f"{len(summ.skipped)} of {len(summ.skipped) + len(sets)} file(s) skipped"
                       + (f"; ranks {summ.ranks_skipped} missing" if summ.ranks_skipped else ""))
    return 0
