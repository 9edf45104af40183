"""Read a Kineto trace file (``.json`` or ``.json.gz``, as torch.profiler exports it) into a RawWindow.

Kineto's Chrome-trace JSON is the offline input of ``perftracker analyze``. Only complete ('X')
events become rows; flows, metadata and instants are dropped. Times become integer nanoseconds on
the trace's own clock (``WindowMeta.clock == "trace"``). GPU rows carry the device index and the
stream as ``tid``.

Formats read: torch >= 1.11 (lower-case categories such as ``cpu_op`` and ``kernel``, integer
``tid``) and the first Kineto format of torch 1.8-1.10 (``Operator``, ``Kernel``, ``Runtime``,
``Memcpy``; ``tid`` a string: ``"123"`` for a CPU thread, ``"stream 7"`` for a GPU stream).
``ProfilerStep#N`` marks the iterations whatever its category (``cpu_op``/``Operator`` before
torch 1.11, ``user_annotation`` after). A trace that is not strict JSON but that Chrome and Perfetto
read (a byte order mark, bytes that are not UTF-8 such as a Latin-1 path in a Python frame's name,
raw control characters or unescaped backslashes in names, lone surrogates) is read with a warning
that says what was repaired (``_loads_lenient``); a truncated file is still an error.

The rank comes from ``distributedInfo``; when that is missing, from the caller's ``rank`` or the
file name (``rank3``, ``worker3``, ``rank_3`` ...: ``rank_from_filename``), and the choice is logged.

Nothing in a trace is trusted (issue 33). A file is read up to ``PERFTRACKER_TRACE_MAX_BYTES``
(after decompression for ``.gz``; 256 MiB by default, about 270 times the largest real trace in the
reference data), so a gzip bomb costs at most that. Event times must be finite, within
``MAX_TIME_US`` of the epoch, durations in [0, ``MAX_SPAN_US``], and one trace's events within
``MAX_SPAN_US`` (a day) of each other; ranks and world sizes in [0, ``MAX_RANK``]; thread ids and
devices must fit their columns. A negative ``dur`` is the one exception: Kineto before pytorch/kineto#646
(torch <= 1.12) wrote an event whose end was never set as ``dur = -ts``; such events are dropped
with a warning that counts them, the rest of the file kept. Anything else raises TraceError naming
the file and the value, so
``perftracker analyze`` skips that file with a warning: never an aborted run (NaN in a
ProfilerStep's ``dur``), a MemoryError (a rank of 10**12) or a silently wrong window (a ``ts`` of
1e300).
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import logging
import os
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perftracker.errors import ConfigError, TraceError
from perftracker.model.patterns import RANGE_MIN
from perftracker.model.raw_window import COLUMNS, EventKind, RawWindow, WindowMeta

_loads: Callable[[bytes], Any]
try:  # optional: about 1.5x faster than json on Kineto files, same result
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover
    _loads = json.loads

log = logging.getLogger(__name__)

MAX_TRACE_BYTES_ENV = "PERFTRACKER_TRACE_MAX_BYTES"
DEFAULT_MAX_TRACE_BYTES = 256 * 2**20  # the largest real trace in the reference data: 0.98 MB of JSON
MAX_RANK = 10_000_000  # ranks and world sizes (the localizer's registration cap)
MAX_TIME_US = 2**62 / 1000  # |ts| and |ts + dur| in microseconds: nanoseconds fit int64 with room
MAX_SPAN_US = 86_400e6  # one trace's events lie within a day of each other; a duration at most that
_INT64 = 2**63
_INT16 = 2**15

_KIND_OF_CAT: dict[str, EventKind] = {
    "cpu_op": EventKind.CPU_OP,
    "operator": EventKind.CPU_OP,
    "python_function": EventKind.PYTHON,
    "kernel": EventKind.KERNEL,
    "gpu_memcpy": EventKind.MEMCPY,
    "gpu_memset": EventKind.MEMSET,
    "cuda_runtime": EventKind.RUNTIME,
    "cuda_driver": EventKind.RUNTIME,
    "user_annotation": EventKind.ANNOTATION,
    "gpu_user_annotation": EventKind.ANNOTATION,
    # torch 1.8-1.10 (Kineto's first format): capitalized categories, read case-insensitively
    "memcpy": EventKind.MEMCPY,
    "memset": EventKind.MEMSET,
    "runtime": EventKind.RUNTIME,
    # other accelerators' host API calls (libkineto ActivityType names; not verified on hardware)
    "xpu_runtime": EventKind.RUNTIME,
    "xpu_driver": EventKind.RUNTIME,
    "privateuse1_runtime": EventKind.RUNTIME,
    "privateuse1_driver": EventKind.RUNTIME,
    "mtia_runtime": EventKind.RUNTIME,
}
_GPU_KINDS = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET)
_STREAM_TID = re.compile(r"\s*stream\s*(\d{1,18})\s*$", re.IGNORECASE)
_NAMED_TID_BASE = 2**40  # thread ids for named (non-numeric) tids: above any OS thread id
_GC_NAME = "Python GC"
# tried in order: "rank3" wins over "worker3", either over "proc3" and any other number in the name
_RANK_IN_NAME = tuple(re.compile(rf"(?<![a-z]){word}[_\-.]?(\d+)", re.IGNORECASE) for word in ("rank", "worker", "proc"))


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int  # 0 when the trace does not say
    source: str  # "distributedInfo" | "flag" | "file name"


def rank_from_filename(path: str | Path) -> int | None:
    """The rank a file name states: ``rank(\\d+)``, else ``worker(\\d+)``, else ``proc(\\d+)``
    (``_``, ``-`` or ``.`` may separate them), before any other number; None when none (or when
    the number is not below ``MAX_RANK``)."""
    name = Path(path).name
    for pattern in _RANK_IN_NAME:
        m = pattern.search(name)
        if m:
            digits = m.group(1)
            return int(digits) if len(digits) <= 8 and int(digits) < MAX_RANK else None
    return None


def trace_max_bytes() -> int:
    """The most bytes of JSON one trace may hold (``PERFTRACKER_TRACE_MAX_BYTES``, else the
    default); ConfigError on a value that is not a positive whole number."""
    raw = os.environ.get(MAX_TRACE_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_TRACE_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{MAX_TRACE_BYTES_ENV}={raw!r}: expected a positive number of bytes")
    return value


def _read_capped(path: Path, limit: int) -> bytes:
    """The file's bytes (decompressed for .gz), or TraceError past ``limit``."""
    gz = path.name.endswith(".gz")
    with open(path, "rb") as raw:
        too_big = not gz and os.fstat(raw.fileno()).st_size > limit  # not read: its size says enough
        data = b""
        if not too_big:
            with gzip.GzipFile(fileobj=raw, mode="rb") if gz else contextlib.nullcontext(raw) as fh:
                data = fh.read(limit + 1)
            too_big = len(data) > limit
    if too_big:
        what = "after decompression" if gz else "on disk"
        raise TraceError(f"{path}: larger than {limit:,} bytes {what} (a gzip bomb, or a trace bigger than "
                         f"{MAX_TRACE_BYTES_ENV} allows)")
    return data


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """A trace is millions of small objects: the cyclic GC would rescan them while they are built."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_trace_json(path: str | Path, max_bytes: int | None = None) -> dict[str, Any]:
    """The parsed trace document; TraceError (one line, naming the file) when it is not one, or
    when it holds more than ``max_bytes`` of JSON (default ``trace_max_bytes()``)."""
    path = Path(path)
    limit = trace_max_bytes() if max_bytes is None else max_bytes
    try:
        data = _read_capped(path, limit)
        with _gc_paused():
            try:
                doc = _loads(data)
            except ValueError as strict_error:
                try:
                    doc = _loads_lenient(path, data)
                except ValueError:
                    raise strict_error from None  # the strict parser's word on where it breaks
        del data
    except RecursionError:
        raise TraceError(f"{path}: invalid Kineto trace (nested too deeply)") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError) as exc:
        what = "truncated or invalid" if not isinstance(exc, FileNotFoundError) else "missing"
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceError(f"{path}: {what} Kineto trace ({type(exc).__name__}: {detail})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: not a Kineto trace (no traceEvents list)")
    return doc


def _loads_lenient(path: Path, data: bytes) -> Any:
    """The document of bytes the strict parser refused, read as Chrome and Perfetto read them: a
    UTF-8 byte order mark skipped, bytes that are not UTF-8 as U+FFFD, control characters inside
    strings kept, a backslash that starts no JSON escape (a Windows path in a name, written
    unescaped) as itself, a lone surrogate (``\\ud800``) as U+FFFD. Each repair is logged once;
    the parser's error is re-raised when none makes the bytes JSON (a truncated file stays one)."""
    fixes: list[str] = []
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
        fixes.append("a UTF-8 byte order mark skipped")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        fixes.append(f"not valid UTF-8 (byte {exc.start}: {data[exc.start]:#04x}); bad bytes read as U+FFFD")
        text = data.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text, strict=False)
    except ValueError as exc:
        if "escape" not in str(exc):
            raise
        text = _BAD_ESCAPE.sub(_escape_fixed, text)
        doc = json.loads(text, strict=False)
        fixes.append("backslashes that start no JSON escape read as themselves")
    doc, scrubbed = _scrub(doc)
    if scrubbed:
        fixes.append(f"{scrubbed} string(s) with a lone surrogate, read with U+FFFD")
    if not fixes:
        fixes.append("control characters inside strings kept")
    log.warning("%s: not strict JSON, read leniently: %s", path, "; ".join(fixes))
    return doc


_BAD_ESCAPE = re.compile(r'\\(u[0-9a-fA-F]{4}|["\\/bfnrt]|.?)', re.DOTALL)


def _escape_fixed(m: re.Match[str]) -> str:
    """A JSON escape as it is; a backslash before anything else doubled, so it reads as itself."""
    return m.group(0) if len(m.group(1)) > 1 or (m.group(1) and m.group(1) in '"\\/bfnrt') else "\\\\" + m.group(1)


def _scrub(v: Any) -> tuple[Any, int]:
    """``v`` with each string that cannot be written as UTF-8 (a lone surrogate) repaired, and how many."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in v), 1
        return v, 0
    n = 0
    if isinstance(v, list):
        for i, x in enumerate(v):
            v[i], k = _scrub(x)
            n += k
    elif isinstance(v, dict):
        for key in list(v):
            v[key], k = _scrub(v[key])
            n += k
    return v, n


def _tid_of(ev: dict[str, Any], kind: EventKind, named: dict[str, int]) -> int | None:
    """The event's thread (CPU) or stream (GPU) id: an int, or torch 1.8-1.10's string forms
    ("123"; "stream 7", else ``args.stream``); another string is a named thread and gets an id of
    its own above any OS thread id. None when there is none."""
    tid = ev.get("tid")
    if isinstance(tid, int) and not isinstance(tid, bool):
        return tid
    if not isinstance(tid, str):
        return None
    text = tid.strip()
    if text.isdigit() and len(text) <= 18:
        return int(text)
    m = _STREAM_TID.match(text)
    if m:
        return int(m.group(1))
    args = ev.get("args")
    stream = args.get("stream") if isinstance(args, dict) else None
    if kind in _GPU_KINDS and isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    return named.setdefault(text[:200], _NAMED_TID_BASE + len(named))


def resolve_rank(doc: dict[str, Any], path: str | Path, rank: int | None = None, prefer_filename: bool = False
                 ) -> RankInfo:
    raw_info = doc.get("distributedInfo")
    info: dict[str, Any] = dict(raw_info) if isinstance(raw_info, dict) else {}
    for key in ("rank", "world_size"):  # written as strings by some tools ("3"): read as the numbers they are
        v = info.get(key)
        if isinstance(v, str) and v.strip().isdigit() and len(v.strip()) <= 18:
            info[key] = int(v.strip())
        elif isinstance(v, bool):
            info[key] = None
    world = int(info.get("world_size", 0) or 0) if isinstance(info.get("world_size", 0), int) else 0
    if not 0 <= world <= MAX_RANK:
        raise TraceError(f"{path}: distributedInfo.world_size {world} is out of range [0, {MAX_RANK}]")
    if not prefer_filename and rank is None and isinstance(info.get("rank"), int):
        if not 0 <= info["rank"] < MAX_RANK:
            raise TraceError(f"{path}: distributedInfo.rank {info['rank']} is out of range [0, {MAX_RANK})")
        return RankInfo(int(info["rank"]), world, "distributedInfo")
    if rank is not None:
        if not 0 <= rank < MAX_RANK:
            raise TraceError(f"{path}: rank {rank} is out of range [0, {MAX_RANK})")
        log.warning("%s: rank %d taken from the command line", path, rank)
        return RankInfo(rank, world, "flag")
    from_name = rank_from_filename(path)
    if from_name is None:
        raise TraceError(f"{path}: no distributedInfo.rank in the trace and no rank in the file name "
                         "(name files like rank3.json, or pass --rank R to `perftracker analyze` for a single trace)")
    log.warning("%s: no distributedInfo rank used; rank %d taken from the file name", path, from_name)
    return RankInfo(from_name, world, "file name")


def read_kineto_trace(path: str | Path, *, rank: int | None = None, prefer_filename: bool = False,
                      job: str = "", session: str = "kineto") -> RawWindow:
    """One rank's Kineto trace as a RawWindow (see the module doc)."""
    path = Path(path)
    doc = load_trace_json(path)
    return window_from_trace(doc, path, resolve_rank(doc, path, rank, prefer_filename), job=job, session=session)


def window_from_trace(doc: dict[str, Any], path: Path, who: RankInfo, job: str = "", session: str = "kineto"
                      ) -> RawWindow:
    """The RawWindow of a parsed trace document (``load_trace_json``) whose rank is resolved, with
    the process groups the trace names (``process_groups``)."""
    with _gc_paused():
        return with_process_groups(doc, _window_from_trace(doc, path, who, job, session))


def _window_from_trace(doc: dict[str, Any], path: Path, who: RankInfo, job: str, session: str) -> RawWindow:
    names: dict[str, int] = {}
    kinds, name_ids, tids, devs, starts, durs = [], [], [], [], [], []
    cpu_pids: Counter[int] = Counter()
    step_tids: Counter[int] = Counter()
    py_tids: Counter[int] = Counter()
    iteration_ms: list[float] = []
    span_lo, span_hi = None, None
    named_tids: dict[str, int] = {}
    no_dur = 0
    negative: list[str] = []
    try:
        for ev in doc["traceEvents"]:
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            cat = ev.get("cat", "")
            kind = _KIND_OF_CAT.get(cat.lower() if isinstance(cat, str) else "")
            if kind is None:
                continue
            tid = _tid_of(ev, kind, named_tids)
            if tid is None:
                continue
            name = str(ev.get("name", ""))
            ts = float(ev["ts"])
            if "dur" not in ev:
                no_dur += 1
            dur = float(ev.get("dur", 0.0))
            if dur < 0:  # Kineto before pytorch/kineto#646 (torch <= 1.12) wrote an unset end (0) as -ts
                negative.append(name)
                continue
            if kind is EventKind.PYTHON and name == _GC_NAME:
                kind = EventKind.GC
            elif kind is EventKind.CPU_OP and name.startswith("ProfilerStep#"):
                kind = EventKind.ANNOTATION  # torch < 1.11 wrote the step marks as operators
            gpu = kind in _GPU_KINDS or cat == "gpu_user_annotation"
            if gpu:
                args = ev.get("args") or {}
                dev = args.get("device", ev.get("pid", 0))
                devs.append(int(dev) if isinstance(dev, int) else 0)
            else:
                devs.append(-1)
                pid = ev.get("pid")
                if isinstance(pid, int):
                    cpu_pids[pid] += 1
                if kind is EventKind.ANNOTATION and name.startswith("ProfilerStep#"):
                    step_tids[tid] += 1
                    iteration_ms.append(dur / 1000.0)
                elif kind is EventKind.PYTHON:
                    py_tids[tid] += 1
            kinds.append(int(kind))
            name_ids.append(names.setdefault(name, len(names)))
            tids.append(tid)
            starts.append(ts)
            durs.append(dur)
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"{path}: invalid Kineto event ({type(exc).__name__}: {exc})") from None
    if not kinds:
        raise TraceError(f"{path}: Kineto trace has no complete events")
    if no_dur:
        log.warning("%s: %d of %d complete events have no dur; read as 0 us", path, no_dur, len(kinds))
    if negative:
        log.warning("%s: %d complete event(s) with a negative dur dropped (an unset end time; the first: %r)",
                    path, len(negative), negative[0][:60])
    starts_us = np.asarray(starts, dtype=np.float64)
    durs_us = np.asarray(durs, dtype=np.float64)
    for ev in doc["traceEvents"]:  # the profiler's own span, when present, bounds the window too
        if isinstance(ev, dict) and ev.get("cat") == "Trace" and ev.get("ph") == "X":
            try:
                lo, length = float(ev["ts"]), float(ev.get("dur", 0))
            except (KeyError, TypeError, ValueError):
                continue
            _check_times(path, np.asarray([lo]), np.asarray([length]), ["the profiler's Trace span"])
            span_lo = int(round(lo * 1000))
            span_hi = span_lo + int(round(length * 1000))
    _check_times(path, starts_us, durs_us, names, name_ids)
    _check_ints(path, tids, -_INT64, _INT64, "thread id")
    _check_ints(path, devs, -1, _INT16, "device")
    start_ns = np.rint(starts_us * 1000.0).astype(np.int64)
    end_ns = np.rint((starts_us + durs_us) * 1000.0).astype(np.int64)
    w_lo = int(start_ns.min()) if span_lo is None else min(span_lo, int(start_ns.min()))
    w_hi = int(end_ns.max()) if span_hi is None else max(span_hi, int(end_ns.max()))
    if w_hi - w_lo > MAX_SPAN_US * 1000:
        raise TraceError(f"{path}: events span {(w_hi - w_lo) / 1e9:.3g} s (from ts {w_lo / 1000:.17g} to "
                         f"{w_hi / 1000:.17g} us), more than a day: an out-of-range time")
    pid = cpu_pids.most_common(1)[0][0] if cpu_pids else 0
    _check_ints(path, [pid], -_INT64, _INT64, "process id")
    training_tid = _training_tid(np.asarray(tids, dtype=np.int64), np.asarray(devs), pid, step_tids, py_tids)
    n = len(kinds)
    cols = {
        "kind": np.asarray(kinds, dtype=COLUMNS["kind"]),
        "name_id": np.asarray(name_ids, dtype=COLUMNS["name_id"]),
        "tid": np.asarray(tids, dtype=COLUMNS["tid"]),
        "device": np.asarray(devs, dtype=COLUMNS["device"]),
        "start_ns": start_ns,
        "end_ns": end_ns,
        "stack_id": np.full(n, -1, dtype=COLUMNS["stack_id"]),
        "parent": np.full(n, -1, dtype=COLUMNS["parent"]),
    }
    meta = WindowMeta(job=job or path.parent.name, session=session, rank=who.rank, world_size=who.world_size,
                      host=str(doc.get("host_name", "")), pid=int(pid), training_tid=int(training_tid),
                      window_start_ns=w_lo, window_end_ns=w_hi, clock="trace", source="kineto", file=str(path),
                      iteration_ms=tuple(iteration_ms))
    return RawWindow(meta=meta, columns=cols, names=tuple(names))


def _check_times(path: Path, starts_us: np.ndarray, durs_us: np.ndarray, names: Any,
                 name_ids: list[int] | None = None) -> None:
    """TraceError naming the first event whose ts or dur is not finite or out of range."""
    with np.errstate(invalid="ignore", over="ignore"):
        ends_us = starts_us + durs_us
        bad = ~(np.isfinite(starts_us) & np.isfinite(durs_us) & (np.abs(starts_us) <= MAX_TIME_US)
                & (np.abs(ends_us) <= MAX_TIME_US) & (durs_us >= 0) & (durs_us <= MAX_SPAN_US))
    if not bad.any():
        return
    i = int(np.argmax(bad))
    if name_ids is None:
        name = str(names[i])
    else:
        by_id = {v: k for k, v in names.items()}
        name = str(by_id.get(name_ids[i], "?"))
    raise TraceError(f"{path}: event {name[:60]!r}: ts {float(starts_us[i])!r} us, dur {float(durs_us[i])!r} us "
                     f"out of range (finite, |ts| <= {MAX_TIME_US:.3g} us, 0 <= dur <= a day)")


def _check_ints(path: Path, values: list[int], lo: int, hi: int, what: str) -> None:
    """TraceError on the first value outside [lo, hi)."""
    if values and (min(values) < lo or max(values) >= hi):
        v = next(v for v in values if not lo <= v < hi)
        raise TraceError(f"{path}: {what} {v} is out of range [{lo}, {hi})")


def _training_tid(tids: np.ndarray, devs: np.ndarray, pid: int, step_tids: Counter[int], py_tids: Counter[int]) -> int:
    """The main thread: tid == pid, else the thread with ProfilerStep#, else the most Python events."""
    cpu = tids[devs < 0]
    if pid and (cpu == pid).any():
        return pid
    if step_tids:
        return step_tids.most_common(1)[0][0]
    if py_tids:
        return py_tids.most_common(1)[0][0]
    if len(cpu):
        vals, counts = np.unique(cpu, return_counts=True)
        return int(vals[np.argmax(counts)])
    return 0


# --- process groups (issue 28) ------------------------------------------------------------------
# PyTorch >= 2.2 writes the job's process groups into ``distributedInfo.pg_config`` (name,
# description, size, member ranks) and, on each NCCL kernel and on ``record_param_comms``, the
# collective's ``Process Group Name``, ``Process Group Ranks`` (a list, or a string such as
# "[1, 3]"), ``Collective name``, ``Seq`` and, for point-to-point transfers, ``Src Rank`` /
# ``Dst Rank`` (global ranks). ``process_groups`` reads both into the ``WindowMeta`` fields
# ``process_groups`` and ``comm``. Nothing is trusted: a field of the wrong type or out of range is
# dropped (the event then names no group, the group no members), never an error. A gloo trace
# under torch 2.13 has ``pg_config`` only: its events name no group.

MAX_COMM_EVENTS = 200_000  # rows of WindowMeta.comm kept per window (the earliest)
_PG_MAX_RANK = 10_000_000  # as MAX_RANK
_PG_MAX_TIME_US = 2**62 / 1000  # as MAX_TIME_US
_PG_MAX_SPAN_US = 86_400e6  # as MAX_SPAN_US


def _pg_ranks(v: Any, size: int = -1, world: int = 0) -> Sequence[int]:
    """A member list: a JSON list of ints or its string form "[1, 3]"; () when it is neither.
    PyTorch cuts the string form of a group of more than 30 ranks to its first 30 and ", ...]"
    (``format_list`` in torch/csrc/profiler/util.cpp): when those 30 are an arithmetic run and the
    event's ``Group size`` says how many there are, the run is continued to that size (how
    Megatron-style data-, pipeline- and tensor-parallel groups are laid out); else (). The size is
    the event's word, not data the trace holds (issue 46: a 10 KB trace declaring 9,999,999 members
    took gigabytes): the run must end inside the trace's world (``world``, when it names one), and
    one of more than ``RANGE_MIN`` members is kept as a ``range`` (O(1) memory, pickled and
    sent as three numbers: ``encode_ranks``)."""
    if isinstance(v, str):
        body = v.strip()
        if not (body.startswith("[") and body.endswith("]")):
            return ()
        parts = [p.strip() for p in body[1:-1].split(",") if p.strip()]
        cut = bool(parts) and parts[-1] == "..."
        parts = parts[:-1] if cut else parts
        if len(parts) > _PG_MAX_RANK or not all(p.isdigit() and len(p) <= 8 for p in parts):
            return ()
        v = [int(p) for p in parts]
        if cut:
            return _continued(v, size, world)
    if not isinstance(v, list) or len(v) > _PG_MAX_RANK:
        return ()
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < _PG_MAX_RANK for x in v):
        return ()
    return tuple(v)


def _continued(prefix: list[int], size: int, world: int = 0) -> Sequence[int]:
    """The members of a cut member list (see ``_pg_ranks``); () when they cannot be known or would
    pass the trace's world (``world`` > 0) or ``_PG_MAX_RANK``."""
    if not 2 <= len(prefix) < size <= _PG_MAX_RANK:
        return ()
    step = prefix[1] - prefix[0]
    if step <= 0 or any(b - a != step for a, b in zip(prefix, prefix[1:], strict=False)):
        return ()
    last = prefix[0] + step * (size - 1)
    if last >= (world if world > 0 else _PG_MAX_RANK):
        return ()
    run = range(prefix[0], last + 1, step)
    return tuple(run) if size <= RANGE_MIN else run


def _pg_int(v: Any, default: int = -1) -> int:
    if isinstance(v, bool):
        return default
    if isinstance(v, int) and -1 <= v < 2**62:
        return v
    if isinstance(v, str) and v.strip().isdigit() and len(v.strip()) <= 18:
        return int(v.strip())
    return default


def process_groups(doc: dict[str, Any]) -> tuple[tuple[tuple[str, str, Sequence[int]], ...],
                                                  tuple[tuple[str, int, int, str, str, int, int, int], ...]]:
    """(groups, comm rows) of a parsed trace document; see ``WindowMeta``."""
    info = doc.get("distributedInfo")
    world = _pg_int(info.get("world_size"), 0) if isinstance(info, dict) else 0
    world = world if 0 < world <= _PG_MAX_RANK else 0
    groups: dict[str, tuple[str, str, Sequence[int]]] = {}
    if isinstance(info, dict) and isinstance(info.get("pg_config"), list):
        for g in info["pg_config"]:
            if not isinstance(g, dict) or not isinstance(g.get("pg_name"), (str, int)) or isinstance(g.get("pg_name"), bool):
                continue
            name = str(g["pg_name"])[:200]
            desc = g.get("pg_desc")
            groups[name] = (name, str(desc)[:200] if isinstance(desc, str) else "", _pg_ranks(g.get("ranks")))
    comm: list[tuple[str, int, int, str, str, int, int, int]] = []
    host: list[tuple[str, int, int, str, str, int, int, int]] = []
    events = doc.get("traceEvents")
    for ev in events if isinstance(events, list) else ():
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        args = ev.get("args")
        if not isinstance(args, dict) or "Process Group Name" not in args:
            continue
        pg = args.get("Process Group Name")
        ts, dur = ev.get("ts"), ev.get("dur", 0)
        if not isinstance(pg, (str, int)) or isinstance(pg, bool) or not isinstance(ts, (int, float)) \
                or not isinstance(dur, (int, float)) or isinstance(ts, bool) or isinstance(dur, bool):
            continue
        if not (abs(ts) <= _PG_MAX_TIME_US and 0 <= dur <= _PG_MAX_SPAN_US):  # NaN and inf fail both
            continue
        name = str(pg)[:200]
        if name not in groups:
            members = _pg_ranks(args.get("Process Group Ranks"), _pg_int(args.get("Group size")), world)
            desc = args.get("Process Group Description")
            groups[name] = (name, str(desc)[:200] if isinstance(desc, str) else "", members)
        elif not groups[name][1] and isinstance(args.get("Process Group Description"), str):
            groups[name] = (name, str(args["Process Group Description"])[:200], groups[name][2])
        coll = args.get("Collective name")
        start = int(round(float(ts) * 1000))
        row = (str(ev.get("name", ""))[:500], start, start + int(round(float(dur) * 1000)), name,
               str(coll)[:100] if isinstance(coll, str) else "", _pg_int(args.get("Seq")),
               _pg_int(args.get("Src Rank")), _pg_int(args.get("Dst Rank")))
        (comm if ev.get("cat") == "kernel" else host).append(row)
        if len(comm) + len(host) >= MAX_COMM_EVENTS:
            break
    # one record per collective: a real NCCL trace names the group on the kernel and on its
    # record_param_comms; the kernels (the critical path's functions) when there are any
    return tuple(groups.values()), tuple(comm or host)


def with_process_groups(doc: dict[str, Any], raw: RawWindow) -> RawWindow:
    """``raw`` with the process groups and group-naming communication events of its trace."""
    groups, comm = process_groups(doc)
    if not groups and not comm:
        return raw
    import dataclasses

    return dataclasses.replace(raw, meta=dataclasses.replace(raw.meta, process_groups=groups, comm=comm))
