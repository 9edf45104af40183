"""One rank's trace file in a worker process of `perftracker analyze` (``perftracker.cli.analyze``).

The first pass (``summarize_file``) reads the file once: it summarizes the whole window and keeps
what the later passes need, so that none reads the file again: the step marks (the step
alignment's plan), the rank's gloo calls when gloo groups are on (``gloo_offline``), and the
window as read, saved in the agent's raw-window format to a scratch directory. A later pass
(``summarize_kept``) summarizes that saved window again, with its gloo groups and its cut.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from perftracker.errors import PerftrackerError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from perftracker.agent.gloo_groups import RankCalls
    from perftracker.agent.summarize.step_align import Cut, StepMarks
    from perftracker.model.raw_window import RawWindow

log = logging.getLogger(__name__)


class _Notes(logging.Handler):
    """The reader's warnings about one file (bad bytes replaced, events without ``dur``), kept to be
    shown by the parent: a worker process's log records are not."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class FileSummary:
    """What the first pass gives the parent for one file."""

    data: bytes  # the PatternSet's compact bytes, over the whole window
    rank_source: str  # where its rank came from
    notes: list[str]  # the reader's warnings about the file
    marks: StepMarks  # its step marks
    kept: str = ""  # where the window as read was saved ('': not saved)
    gloo: RankCalls | None = None  # its gloo calls (None: not asked, or not read)
    dropped: list[str] = field(default_factory=list)  # what could not be kept, and why


def samples_beside(trace: Path) -> Path:
    """Where a trace's hardware samples lie, when it has any: ``rank3.json.gz`` -> ``rank3.samples.npz``
    (a ``SampleSet`` in the agent's own format, on the trace's time base)."""
    name = trace.name
    for suffix in (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return trace.with_name(name + ".samples.npz")


def summarize_file(path: str, prefer_filename: bool, job: str, rank: int | None = None,
                   ranks_per_host: int = 0, keep: str = "", gloo: bool = False) -> FileSummary:
    """One rank, in a worker process: its summary over the whole window. Hardware samples beside the
    trace (``samples_beside``) give μ/σ; a samples file that cannot be read is a warning, and the
    rank keeps β only. ``keep``: where to save the window as read, for ``summarize_kept``; ``gloo``:
    read the rank's gloo calls too. Either failing loses only itself (``FileSummary.dropped``)."""
    from perftracker.agent import kineto
    from perftracker.agent.summarize.step_align import step_marks

    notes = _Notes()
    level, propagate = kineto.log.level, kineto.log.propagate
    kineto.log.setLevel(min(kineto.log.getEffectiveLevel(), logging.WARNING))  # kept even when the CLI is quiet
    kineto.log.propagate = False  # the parent prints them, once
    kineto.log.addHandler(notes)
    try:
        doc = kineto.load_trace_json(path)
        kept = len(notes.lines)
        who = kineto.resolve_rank(doc, path, rank, prefer_filename)
        del notes.lines[kept:]  # the rank's source is reported with the progress line
        raw = kineto.window_from_trace(doc, Path(path), who, job=job, session="offline")
    finally:
        kineto.log.removeHandler(notes)
        kineto.log.setLevel(level)
        kineto.log.propagate = propagate
    out = FileSummary(b"", who.source, notes.lines, step_marks(raw))
    if gloo:
        from perftracker.agent.gloo_groups import gloo_calls

        try:
            out.gloo = gloo_calls(doc, who.rank)
        except Exception as exc:  # noqa: BLE001 - loses only this rank's gloo groups
            out.dropped.append(f"gloo calls not read ({type(exc).__name__}: {exc})")
    del doc
    if keep:
        try:
            out.kept = str(raw.save(keep))
        except (OSError, ValueError) as exc:  # the later passes read the trace again
            out.dropped.append(f"window not kept ({type(exc).__name__}: {exc})")
    out.data = _summarize(raw, Path(path), ranks_per_host, notes.lines)
    return out


def summarize_kept(kept: str, path: str, prefer_filename: bool, job: str, rank: int | None = None,
                   ranks_per_host: int = 0, gloo_groups: Mapping[str, str] | None = None,
                   cut: Cut | None = None) -> bytes:
    """A later pass over one rank: the PatternSet's compact bytes of the window the first pass kept
    at ``kept`` (the trace at ``path`` read again when it kept none), with ``gloo_groups`` (the group
    of each gloo event name, ``gloo_offline.with_gloo_groups``) and restricted to ``cut``."""
    from perftracker.agent.summarize.step_align import cut_window
    from perftracker.model.raw_window import RawWindow

    if kept:
        raw = RawWindow.load(kept)
    else:
        from perftracker.agent import kineto

        doc = kineto.load_trace_json(path)
        raw = kineto.window_from_trace(doc, Path(path), kineto.resolve_rank(doc, path, rank, prefer_filename),
                                       job=job, session="offline")
    if gloo_groups:
        from perftracker.cli.gloo_offline import with_gloo_groups

        raw = with_gloo_groups(raw, gloo_groups)
    if cut is not None:
        raw = cut_window(raw, cut)
    return _summarize(raw, Path(path), ranks_per_host, [])


def _summarize(raw: RawWindow, trace: Path, ranks_per_host: int, notes: list[str]) -> bytes:
    """``raw``'s PatternSet in compact bytes, with the samples beside ``trace`` when it has any (a
    samples file that cannot be read is a line in ``notes``)."""
    from perftracker.agent.summarize.summarizer import SummarizeOptions, summarize_window
    from perftracker.model.raw_window import SampleSet

    samples = None
    beside = samples_beside(trace)
    if beside.is_file():
        try:
            samples = SampleSet.load(beside)
        except (PerftrackerError, OSError, ValueError, KeyError) as exc:
            notes.append(f"{beside.name}: samples not read, β only ({exc})")
    opts = SummarizeOptions(local_world_size=ranks_per_host)
    return summarize_window(raw, samples, opts).to_bytes()
