"""Reading and writing a directory of per-rank Kineto traces, and tiling a recorded step K times."""

from __future__ import annotations

import copy
import gzip
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perftracker.agent.kineto import load_trace_json, resolve_rank

from perftracker.errors import InputError, TraceError

log = logging.getLogger(__name__)

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})
NOT_MODELLED_X = frozenset({"Trace", "gpu_user_annotation"})  # re-timed by warping, not by the graph
_ID_ARGS = ("correlation", "External id")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class RankTrace:
    """One rank's trace: the document (its traceEvents possibly tiled) and where it came from."""

    rank: int
    path: Path
    doc: dict[str, Any]
    tile: list[int]  # per traceEvents entry: which copy of the recorded step it belongs to

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.doc["traceEvents"]


def is_timed(e: dict[str, Any]) -> bool:
    return e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur", 0), (int, float))


def is_modelled(e: dict[str, Any]) -> bool:
    """A complete event the timing graph re-times (GPU work and the host's events)."""
    return is_timed(e) and e.get("cat") not in NOT_MODELLED_X and e.get("pid") != "Spans"


def trace_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory")
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))
    if not files:
        raise InputError(f"{directory}: no Kineto trace files (*.json, *.json.gz)")
    return files


def read_trace_dir(directory: Path) -> list[RankTrace]:
    """Every readable rank of DIR, sorted by rank. A file that cannot be read is a warning; two files
    with one rank, or no readable file at all, is an InputError."""
    out: dict[int, RankTrace] = {}
    for path in trace_files(directory):
        try:
            doc = load_trace_json(path)
            who = resolve_rank(doc, path)
        except (TraceError, InputError) as exc:
            log.warning("skipping %s: %s", path, exc)
            continue
        if not isinstance(doc.get("traceEvents"), list):
            log.warning("skipping %s: no traceEvents list", path)
            continue
        if who.rank in out:
            raise InputError(f"rank {who.rank} appears twice: {out[who.rank].path} and {path}")
        out[who.rank] = RankTrace(who.rank, path, doc, [0] * len(doc["traceEvents"]))
    if not out:
        raise InputError(f"{directory}: no readable Kineto trace")
    return [out[r] for r in sorted(out)]


def job_period_us(ranks: list[RankTrace]) -> float:
    """The period for tiling: the longest rank's span of modelled events (so copies never overlap)."""
    spans = []
    for rt in ranks:
        ts = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in rt.events if is_modelled(e)]
        if ts:
            spans.append(max(b for _, b in ts) - min(a for a, _ in ts))
    if not spans:
        raise InputError("no timed events in the trace set")
    return max(spans)


def _id_span(events: list[dict[str, Any]]) -> int:
    hi = 0
    for e in events:
        if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
            hi = max(hi, e["id"])
        args = e.get("args")
        if isinstance(args, dict):
            for k in _ID_ARGS:
                v = args.get(k)
                if isinstance(v, int):
                    hi = max(hi, v)
    return hi + 1


def tile(ranks: list[RankTrace], steps: int) -> None:
    """Repeat each rank's recorded events ``steps`` times, copy c shifted by c times the job period,
    with correlation, External id and flow ids renumbered per copy and ProfilerStep#N counting on.
    In place. The gaps between copies are the recorded ones (each rank's share of the period that its
    trace does not cover repeats, as it did in the recording)."""
    if steps < 1:
        raise InputError(f"--steps must be >= 1, got {steps}")
    if steps == 1:
        return
    period = job_period_us(ranks)
    for rt in ranks:
        base = rt.events
        span = _id_span(base)
        out = list(base)
        tiles = [0] * len(base)
        for c in range(1, steps):
            for e in base:
                ph = e.get("ph")
                if ph == "M" or ph == "i" or not isinstance(e.get("ts"), (int, float)):
                    continue
                if e.get("cat") == "Trace" or e.get("pid") == "Spans":
                    continue
                n = dict(e)
                n["ts"] = e["ts"] + c * period
                if ph in ("s", "f") and isinstance(e.get("id"), int):
                    n["id"] = e["id"] + c * span
                args = e.get("args")
                if isinstance(args, dict) and any(isinstance(args.get(k), int) for k in _ID_ARGS):
                    n["args"] = a = dict(args)
                    for k in _ID_ARGS:
                        if isinstance(a.get(k), int):
                            a[k] = a[k] + c * span
                m = _STEP.match(str(e.get("name", "")))
                if m:
                    n["name"] = f"ProfilerStep#{int(m.group(1)) + c}"
                out.append(n)
                tiles.append(c)
        rt.doc["traceEvents"] = out
        rt.tile = tiles


def dumps_kineto(doc: dict[str, Any]) -> str:
    """JSON laid out like Kineto writes it: one top-level key per line, one event per line, ``": "``
    after keys (tools such as HTA find the rank with a regex on ``"rank": N``)."""
    parts = []
    for k, v in doc.items():
        if k == "traceEvents" and isinstance(v, list):
            body = ",\n".join("  " + json.dumps(e) for e in v)
            parts.append(f'  "traceEvents": [\n{body}\n  ]')
        else:
            parts.append(f"  {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write_trace(rt: RankTrace, out_dir: Path) -> Path:
    """Write one rank's document under out_dir with its input file name (gzip if the input was)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / rt.path.name
    data = dumps_kineto(rt.doc).encode()
    tmp = dest.with_name(dest.name + ".tmp")
    if dest.name.endswith(".gz"):
        with gzip.open(tmp, "wb", compresslevel=5) as fh:
            fh.write(data)
    else:
        tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def clone(ranks: list[RankTrace]) -> list[RankTrace]:
    """An independent copy (the event dicts are rewritten on output)."""
    return [RankTrace(r.rank, r.path, copy.deepcopy(r.doc), list(r.tile)) for r in ranks]
