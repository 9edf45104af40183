"""`perftracker export-trace`: one rank's profile window as a Chrome/Perfetto trace JSON, with the
critical path as its own track.

Input: the ``RawWindow`` the profile window saved (``<run_dir>/windows/<session>-rank<R>.raw.npz``;
the agent keeps it only when started with ``--keep-windows``), any raw window file via ``--raw``, or a
Kineto trace (``.json``/``.json.gz``, read by ``perftracker.agent.kineto.read_kineto_trace``) via ``--raw``.
Output: Chrome trace-event JSON (``traceEvents`` of complete "X" events, in microseconds from the
window start), which ui.perfetto.dev and chrome://tracing open.

Tracks: one process for the rank's CPU threads (training thread first), one per GPU (streams as
threads), and one process "critical path" whose single thread shows, for each moment of the window,
the function that holds the critical path (docs/design.md section 5: the highest-priority category
active; within a category, one of the active executions). The track is drawn from the summarizer's
own frames (``perftracker.agent.summarize.summarizer.window_frames``: its roles, thread timelines and sweep priorities)
with the priority rule of ``perftracker.agent.summarize.critical_path``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from perftracker.cli import output
from perftracker.cli.options import RUN_DIR_DEFAULT_TEXT, add_data_dir
from perftracker.errors import PerftrackerError
from perftracker.model.raw_window import EventKind, RawWindow

HELP = "write one rank's window as a Perfetto/Chrome trace with the critical path"
DESCRIPTION = """Write one rank's profile window as a Chrome/Perfetto trace (open it in ui.perfetto.dev).

The raw window windows/<session>-rank<R>.raw.npz is looked up under the data directory
(--data-dir, where `perftracker run --keep-windows` and `perftracker demo --keep-windows` keep
them), then under the agent's run directory (--run-dir). SESSION `latest` is the newest session
with a raw window of that rank. The node agent deletes raw windows after uploading the patterns
unless it runs with --keep-windows (run, demo and agent alike); --raw FILE names a raw window
file directly, or a Kineto trace (.json or .json.gz, as torch.profiler exports it; its rank from
distributedInfo, the file name or --rank).

examples:
  perftracker demo --keep-windows && perftracker export-trace latest --rank 0 -o t.json
  perftracker export-trace 20261128-020900-c5e6ca --rank 3 -o rank3.trace.json
  perftracker export-trace --raw perftracker-runs/windows/20261128-020900-c5e6ca-rank3.raw.npz -o rank3.json
  perftracker export-trace --raw worker3.pt.trace.json.gz -o rank3.json
"""

CRITICAL_PID = 1 << 30  # a pid no real process has in the trace
GPU_PID_BASE = 1 << 29
_KIND_NAMES = {k.value: k.name.lower() for k in EventKind}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", nargs="?", default=None,
                        help="session id, or 'latest' (not needed with --raw; default latest)")
    parser.add_argument("--rank", type=int, default=None,
                        help="rank whose window to export (required without --raw; with a Kineto trace that "
                             "has no distributedInfo, its rank)")
    parser.add_argument("-o", "--output", metavar="FILE", required=True, help="trace JSON file to write")
    add_data_dir(parser, "where run/demo --keep-windows keep windows/")
    parser.add_argument("--run-dir", default=None, metavar="DIR",
                        help=f"the agent's run directory, whose windows/ it also searches (default {RUN_DIR_DEFAULT_TEXT})")
    parser.add_argument("--raw", "--trace", metavar="FILE", default=None,
                        help="a raw window file (.raw.npz) or a Kineto trace (.json, .json.gz) to export")


def run(args: argparse.Namespace) -> int:
    output.check_writable(args.output)
    if not args.raw and args.rank is None:
        raise PerftrackerError("give a SESSION (or latest) and --rank R, or --raw FILE")
    path = Path(args.raw) if args.raw else find_raw_window(args.session or "latest", args.rank, args.run_dir,
                                                           args.runs_dir)
    raw = load_window(path, args.rank)
    trace = build_trace(raw)
    out = output.write_file(args.output, lambda fh: json.dump(trace, fh, separators=(",", ":")))
    n_crit = sum(1 for e in trace["traceEvents"] if e.get("pid") == CRITICAL_PID and e.get("ph") == "X")
    output.message(f"wrote {out}: rank {raw.meta.rank}, session {raw.meta.session}, {len(raw)} events, "
                   f"{n_crit} critical-path slices; open it in ui.perfetto.dev")
    return 0


def load_window(path: Path, rank: int | None = None) -> RawWindow:
    """A raw window file, or a Kineto trace (.json, .json.gz) read as one."""
    if path.name.endswith((".json", ".json.gz")):
        from perftracker.agent.kineto import read_kineto_trace

        return read_kineto_trace(path, rank=rank, session="kineto")
    if not path.is_file():
        raise PerftrackerError(f"--raw {path}: no such file")
    return RawWindow.load(path)


def find_raw_window(session: str, rank: int | None, run_dir: str | None, data_dir: str | None = None) -> Path:
    """The raw window file of (session, rank) under the data directory's or the run directory's
    windows/; session ``latest``: the newest such file of that rank."""
    if rank is None:
        raise PerftrackerError("--rank R is required (or --raw FILE)")
    if run_dir is None:
        from perftracker.config import Config

        run_dir = Config.from_env().run_dir
    dirs = [Path(d) / "windows" for d in (data_dir, run_dir) if d]
    where = " or ".join(str(d) for d in dirs)
    if session == "latest":
        found = [p for d in dirs for p in d.glob(f"*-rank{rank}.raw.npz") if p.is_file() and not p.is_symlink()]
        if found:
            return max(found, key=lambda p: p.stat().st_mtime_ns)
        raise PerftrackerError(
            f"no raw window of rank {rank} under {where}; the agent deletes raw windows after upload: run "
            "`perftracker run --keep-windows ...` or `perftracker demo --keep-windows` (an agent: --keep-windows; --keep-files before), "
            "or pass --raw FILE")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in session) or "session"
    candidates = [c for d in dirs for c in (d / f"{safe}-rank{rank}.raw.npz",
                                            *sorted((d / safe).glob(f"*rank{rank}.raw.npz")))]
    for c in candidates:
        if c.is_file():
            return c
    raise PerftrackerError(
        f"no raw window for session {session!r} rank {rank} under {where} "
        f"(looked for {safe}-rank{rank}.raw.npz); the agent deletes raw windows after upload unless it runs "
        "with --keep-windows (run, demo and agent; an agent's old --keep-files); pass --raw FILE, --data-dir DIR or --run-dir DIR"
    )


# ------------------------------------------------------------------------------------------------
# the critical path as intervals
# ------------------------------------------------------------------------------------------------


def critical_intervals(start_ns: np.ndarray, end_ns: np.ndarray, level: np.ndarray,
                       window_start_ns: int, window_end_ns: int, n_levels: int = 4
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The critical path as (start_ns, end_ns, segment) rows, merged where one segment holds it.

    Same rule as ``perftracker.agent.summarize.critical_path.critical_ns``: each moment belongs to the highest-priority
    level (lowest number) with an active segment; of that level's active segments, the one that
    ends last is shown as the holder."""
    s = np.clip(start_ns, window_start_ns, window_end_ns).astype(np.int64)
    e = np.clip(end_ns, window_start_ns, window_end_ns).astype(np.int64)
    valid = (e > s) & (level >= 0) & (level < n_levels)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not valid.any():
        return empty
    bounds = np.unique(np.concatenate([s[valid], e[valid]]))
    t0, t1 = bounds[:-1], bounds[1:]
    holder = np.full(len(t0), -1, dtype=np.int64)
    for lvl in range(n_levels):  # lowest priority first, so higher levels overwrite
        lvl_rows = np.flatnonzero(valid & (level == n_levels - 1 - lvl))
        if not len(lvl_rows):
            continue
        order = lvl_rows[np.argsort(s[lvl_rows], kind="stable")]
        starts, ends = s[order], e[order]
        cummax = np.maximum.accumulate(ends)
        arg = np.maximum.accumulate(np.where(ends == cummax, np.arange(len(order)), 0))
        k = np.searchsorted(starts, t0, side="right") - 1
        ok = k >= 0
        covered = np.zeros(len(t0), dtype=bool)
        covered[ok] = cummax[k[ok]] > t0[ok]
        holder[covered] = order[arg[k[covered]]]
    keep = holder >= 0
    t0, t1, holder = t0[keep], t1[keep], holder[keep]
    if not len(holder):
        return empty
    # merge adjacent elementary intervals held by the same segment
    new = np.r_[True, (holder[1:] != holder[:-1]) | (t0[1:] != t1[:-1])]
    starts_idx = np.flatnonzero(new)
    ends_idx = np.r_[starts_idx[1:] - 1, len(holder) - 1]
    return t0[starts_idx], t1[ends_idx], holder[starts_idx]


def _critical_path_events(raw: RawWindow, us: Callable[[int], float]) -> list[dict[str, Any]]:
    """The critical-path track: the summarizer's frames (``perftracker.agent.summarize.summarizer.window_frames``: same
    roles, timelines and sweep priorities), each moment shown as held by one of them."""
    from perftracker.agent.summarize.categories import CATEGORY_OF_LEVEL
    from perftracker.agent.summarize.summarizer import N_PRIORITIES, window_frames

    meta = raw.meta
    fr = window_frames(raw)
    segs = fr.segments
    c0, c1, seg = critical_intervals(segs.start_ns, segs.end_ns, fr.priority[segs.owner], meta.window_start_ns,
                                     meta.window_end_ns, n_levels=N_PRIORITIES)
    raw_tid, raw_device = raw.col("tid"), raw.col("device")
    events = []
    for a, b, k in zip(c0.tolist(), c1.tolist(), seg.tolist(), strict=True):
        f = int(segs.owner[k])
        level = CATEGORY_OF_LEVEL[int(fr.role[f])].value
        fn = fr.names[int(fr.name_id[f])]
        row = int(fr.row[f])  # the recorded thread, not the one an autograd thread joined; -1: a reducer wait
        thread, device = (int(raw_tid[row]), int(raw_device[row])) if row >= 0 else (int(fr.tid[f]), int(fr.device[f]))
        events.append({
            "ph": "X", "name": f"{level}: {fn}", "cat": "critical_path", "pid": CRITICAL_PID, "tid": 1,
            "ts": us(a), "dur": round((b - a) / 1000.0, 3),
            "args": {"category": level, "function": fn, "thread": thread, "device": device},
        })
    return events


# ------------------------------------------------------------------------------------------------
# the trace
# ------------------------------------------------------------------------------------------------


def build_trace(raw: RawWindow) -> dict[str, Any]:
    """Chrome trace-event JSON of one raw window, with a critical-path track."""
    meta = raw.meta
    t_base = meta.window_start_ns

    def us(t_ns: int) -> float:
        return round((int(t_ns) - t_base) / 1000.0, 3)

    kind = raw.col("kind")
    tid = raw.col("tid")
    device = raw.col("device")
    start = raw.col("start_ns")
    end = raw.col("end_ns")
    stack_id = raw.col("stack_id")
    name_id = raw.col("name_id")
    cpu_pid = meta.pid or 1
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": cpu_pid, "args": {"name": f"rank {meta.rank} ({meta.host}, pid {meta.pid})"}},
        {"ph": "M", "name": "process_sort_index", "pid": cpu_pid, "args": {"sort_index": 1}},
        {"ph": "M", "name": "process_name", "pid": CRITICAL_PID, "args": {"name": f"critical path (rank {meta.rank})"}},
        {"ph": "M", "name": "process_sort_index", "pid": CRITICAL_PID, "args": {"sort_index": 0}},
        {"ph": "M", "name": "thread_name", "pid": CRITICAL_PID, "tid": 1, "args": {"name": "critical path"}},
    ]
    threads = sorted({int(t) for t, d in zip(tid.tolist(), device.tolist(), strict=True) if d < 0})
    for t in threads:
        label = "training thread" if t == meta.training_tid else f"thread {t}"
        events.append({"ph": "M", "name": "thread_name", "pid": cpu_pid, "tid": t, "args": {"name": label}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": cpu_pid, "tid": t,
                       "args": {"sort_index": 0 if t == meta.training_tid else 1}})
    for d in sorted({int(d) for d in device.tolist() if d >= 0}):
        events.append({"ph": "M", "name": "process_name", "pid": GPU_PID_BASE + d, "args": {"name": f"GPU {d}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": GPU_PID_BASE + d, "args": {"sort_index": 2 + d}})
    for i in range(len(raw)):
        d = int(device[i])
        ev: dict[str, Any] = {
            "ph": "X", "name": raw.names[int(name_id[i])], "cat": _KIND_NAMES.get(int(kind[i]), "other"),
            "pid": cpu_pid if d < 0 else GPU_PID_BASE + d, "tid": int(tid[i]),
            "ts": us(start[i]), "dur": round((int(end[i]) - int(start[i])) / 1000.0, 3),
        }
        sid = int(stack_id[i])
        if 0 <= sid < len(raw.stacks):
            ev["args"] = {"stack": [raw.names[j] for j in raw.stacks[sid]]}
        events.append(ev)
    events += _critical_path_events(raw, us)
    events.append({"ph": "i", "s": "g", "name": "window start", "pid": CRITICAL_PID, "tid": 1, "ts": 0.0})
    events.append({"ph": "i", "s": "g", "name": "window end", "pid": CRITICAL_PID, "tid": 1, "ts": us(meta.window_end_ns)})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "perftracker export-trace", "job": meta.job, "session": meta.session, "rank": meta.rank,
            "world_size": meta.world_size, "host": meta.host, "window_start_ns": meta.window_start_ns,
            "window_end_ns": meta.window_end_ns, "clock": meta.clock, "source": meta.source,
            "time_origin": "ts is microseconds from window_start_ns",
        },
    }
