"""The columnar wire form of PatternSets: one node's ranks in one compact, versioned body.

An agent uploads all of its local ranks' patterns of a session in one request (content type
``application/x-perftracker-columns``); the localizer validates it with numpy, keeps it as arrays
and stores the bytes as they came. JSON (``PatternSet.to_dict``) stays the human and test form.

Layout (little-endian)::

    0   4s   magic b"PTCB"
    4   u16  format version (FORMAT_VERSION)
    6   u16  flags: bit 0 = the array section is zlib-compressed
    8   u32  table_len: bytes of the function table JSON that follows the header
    12  u32  meta_len: bytes of the meta JSON that follows the table
    16  u32  rows: M, the patterns of all ranks together
    20  table JSON (utf-8): {"frames": [str], "functions": [[key, category, label, resource]]}
        (a Python key is a list of frame indices; the nodes of a job send the same table, so the
        localizer parses each distinct table once)
    ..  meta JSON (utf-8): {"schema_version", "job", "session", "workers": [{"rank",
        "world_size", "host", "local_rank", "pid", "coords", "source", "gpu",
        "window_start_ns", "window_end_ns", "iteration_ms", "rows"}]}
    ..  arrays: fidx int32[M], values uint32[M, 3] ((β, μ, σ) in millionths, at most 1,000,000:
        the 6 decimals of the JSON form, exactly), executions int64[M], critical_ns int64[M];
        worker i owns the next ``workers[i]["rows"]`` rows

Nothing is unpickled; a body of another format version is refused with a clear error
(``WireVersionError``). Pure functions, numpy and the stdlib only.
"""

from __future__ import annotations

import json
import math
import struct
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perftracker.errors import SchemaError
from perftracker.model.patterns import (
    Category,
    Pattern,
    PatternSet,
    ProcessGroup,
    groups_fields_dict,
    parse_groups_fields,
)
from perftracker.model.schema import (
    SCHEMA_VERSION,
    check_schema_version,
    optional,
    require,
    rounded,
)
from perftracker.model.step_record import StepRecord
from perftracker.model.window_cost import window_cost_fields

COLUMNS_CONTENT_TYPE = "application/x-perftracker-columns"
MAGIC = b"PTCB"
FORMAT_VERSION = 1
FLAG_ZLIB = 1
HEADER = struct.Struct("<4sHHIII")
_TABLES: dict[bytes, tuple[Any, ...]] = {}  # table JSON -> parsed (keys, labels, categories, resources)
_TABLES_LOCK = threading.Lock()
_MAX_TABLES = 64
ROW_BYTES = 4 + 12 + 8 + 8
MICRO = 1_000_000  # (β, μ, σ) travel as integer millionths: the JSON form's 6 decimals, exactly
_CATEGORIES = {c.value: c for c in Category}


class WireVersionError(SchemaError):
    """A columnar body of a format version this perftracker does not read."""


@dataclass(frozen=True)
class WorkerMeta:
    """One rank's identity and window in a batch (a PatternSet without its patterns)."""

    rank: int
    world_size: int
    host: str
    window_start_ns: int
    window_end_ns: int
    local_rank: int = -1
    pid: int = 0
    coords: Mapping[str, int] = field(default_factory=dict)
    source: str = "online"
    gpu: bool = False
    iteration_ms: tuple[float, ...] = ()
    # the worker's process groups, its collectives' groups and its compute per step (issue 28; the
    # PatternSet fields of the same names), in the meta only when there are any
    groups: tuple[ProcessGroup, ...] = ()
    comm: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    steps_ms: tuple[float, ...] = ()
    step_group: str = ""
    window_cost: Mapping[str, float] = field(default_factory=dict)  # PatternSet.window_cost (issue 30)
    step_record: StepRecord | None = None  # PatternSet.step_record (issue 28), in the meta when there is one
    cpu_place: str = ""  # PatternSet.cpu_place (issue 31), in the meta when known


@dataclass(frozen=True, eq=False)
class PatternBatch:
    """Several ranks' patterns of one session as arrays; ``functions`` is this batch's own table.

    Rows of worker i are ``offsets[i]:offsets[i + 1]``."""

    job: str
    session: str
    workers: tuple[WorkerMeta, ...]
    keys: tuple[str, ...]
    labels: tuple[str, ...]  # "" when the label is the key's last frame
    categories: tuple[Category, ...]
    resources: tuple[str, ...]
    offsets: np.ndarray  # (W + 1,) int64
    fidx: np.ndarray  # (M,) int32
    values: np.ndarray  # (M, 3) float64
    executions: np.ndarray  # (M,) int64
    critical_ns: np.ndarray  # (M,) int64

    @property
    def ranks(self) -> list[int]:
        return [w.rank for w in self.workers]

    @property
    def rows(self) -> int:
        return int(self.fidx.shape[0])


# ---------------------------------------------------------------- PatternSets <-> batch
def batch_from_sets(sets: Sequence[PatternSet]) -> PatternBatch:
    """Stack PatternSets of one job and session (values rounded as in the JSON form)."""
    if not sets:
        raise SchemaError("a patterns batch needs at least one PatternSet")
    job, session = sets[0].job, sets[0].session
    index: dict[str, int] = {}
    keys: list[str] = []
    labels: list[str] = []
    cats: list[Category] = []
    res: list[str] = []
    fidx: list[int] = []
    vals: list[float] = []
    ex: list[int] = []
    crit: list[int] = []
    workers = []
    offsets = [0]
    for ps in sets:
        if ps.job != job or ps.session != session:
            raise SchemaError(f"a patterns batch holds one job and session: {ps.job}/{ps.session} "
                              f"next to {job}/{session}")
        for p in ps.patterns:
            f = index.get(p.key)
            if f is None:
                f = index[p.key] = len(keys)
                keys.append(p.key)
                labels.append(p.label if p.label != p.key.rsplit(";", 1)[-1] else "")
                cats.append(p.category)
                res.append(p.resource)
            fidx.append(f)
            vals += (rounded(p.beta), rounded(p.mu), rounded(p.sigma))
            ex.append(p.executions)
            crit.append(p.critical_ns)
        offsets.append(len(fidx))
        workers.append(WorkerMeta(ps.rank, ps.world_size, ps.host, ps.window_start_ns, ps.window_end_ns,
                                  ps.local_rank, ps.pid, dict(ps.coords), ps.source, ps.gpu,
                                  tuple(rounded(x) for x in ps.iteration_ms), tuple(ps.groups), dict(ps.comm),
                                  tuple(ps.steps_ms), ps.step_group, dict(ps.window_cost), ps.step_record,
                                  ps.cpu_place))
    return PatternBatch(job, session, tuple(workers), tuple(keys), tuple(labels), tuple(cats), tuple(res),
                        np.array(offsets, dtype=np.int64), np.array(fidx, dtype=np.int32),
                        np.array(vals, dtype=np.float64).reshape(-1, 3), np.array(ex, dtype=np.int64),
                        np.array(crit, dtype=np.int64))


def batch_to_sets(batch: PatternBatch) -> list[PatternSet]:
    """The PatternSets a batch holds (for tools and tests; the localizer keeps the arrays)."""
    out = []
    for i, w in enumerate(batch.workers):
        a, b = int(batch.offsets[i]), int(batch.offsets[i + 1])
        pats = []
        for r in range(a, b):
            f = int(batch.fidx[r])
            key = batch.keys[f]
            beta, mu, sigma = (float(x) for x in batch.values[r])
            pats.append(Pattern(key, batch.categories[f], beta, mu, sigma,
                                batch.labels[f] or key.rsplit(";", 1)[-1], int(batch.executions[r]),
                                int(batch.critical_ns[r]), batch.resources[f]))
        out.append(PatternSet(job=batch.job, session=batch.session, rank=w.rank, world_size=w.world_size,
                              host=w.host, window_start_ns=w.window_start_ns, window_end_ns=w.window_end_ns,
                              patterns=tuple(pats), local_rank=w.local_rank, pid=w.pid, coords=dict(w.coords),
                              source=w.source, gpu=w.gpu, iteration_ms=w.iteration_ms, groups=w.groups,
                              comm=dict(w.comm), steps_ms=w.steps_ms, step_group=w.step_group, step_record=w.step_record,
                              window_cost=dict(w.window_cost), cpu_place=w.cpu_place))
    return out


# ---------------------------------------------------------------- encode
def table_dict(batch: PatternBatch) -> dict[str, Any]:
    """The function table of a batch (Python stacks share one frame table)."""
    frames: dict[str, int] = {}
    functions = []
    for key, label, cat, res in zip(batch.keys, batch.labels, batch.categories, batch.resources, strict=True):
        k: Any = [frames.setdefault(fr, len(frames)) for fr in key.split(";")] if cat is Category.PYTHON else key
        functions.append([k, cat.value, label, res])
    return {"frames": list(frames), "functions": functions}


def meta_dict(batch: PatternBatch) -> dict[str, Any]:
    """The meta JSON object of a batch: its job, session and workers."""
    workers = []
    for i, w in enumerate(batch.workers):
        workers.append({"rank": w.rank, "world_size": w.world_size, "host": w.host, "local_rank": w.local_rank,
                        "pid": w.pid, "coords": dict(w.coords), "source": w.source, "gpu": w.gpu,
                        "window_start_ns": w.window_start_ns, "window_end_ns": w.window_end_ns,
                        "iteration_ms": list(w.iteration_ms),
                        "rows": int(batch.offsets[i + 1] - batch.offsets[i]), **groups_fields_dict(w.groups, w.comm, w.steps_ms, w.step_group, w.step_record),
                        **({"window_cost": dict(w.window_cost)} if w.window_cost else {}),
                        **({"cpu_place": w.cpu_place} if w.cpu_place else {})})
    return {"schema_version": SCHEMA_VERSION, "job": batch.job, "session": batch.session, "workers": workers}


def _json(d: dict[str, Any]) -> bytes:
    return json.dumps(d, separators=(",", ":"), allow_nan=False).encode()


def array_bytes(batch: PatternBatch) -> bytes:
    """The array section, uncompressed."""
    micro = np.rint(np.clip(batch.values, 0.0, 1.0) * MICRO).astype("<u4")
    return b"".join((batch.fidx.astype("<i4").tobytes(), micro.tobytes(),
                     batch.executions.astype("<i8").tobytes(), batch.critical_ns.astype("<i8").tobytes()))


def frame(table: bytes, meta: bytes, rows: int, arrays: bytes, compressed: bool) -> bytes:
    """Header + table + meta + array section (``arrays`` already zlib-compressed when ``compressed``)."""
    return (HEADER.pack(MAGIC, FORMAT_VERSION, FLAG_ZLIB if compressed else 0, len(table), len(meta), rows)
            + table + meta + arrays)


def encode_batch(batch: PatternBatch, *, compress: bool = True) -> bytes:
    arrays = array_bytes(batch)
    return frame(_json(table_dict(batch)), _json(meta_dict(batch)), batch.rows,
                 zlib.compress(arrays, 1) if compress else arrays, compress)


def encode_sets(sets: Sequence[PatternSet], *, compress: bool = True) -> bytes:
    """The upload body for one node: its ranks' PatternSets of one session."""
    return encode_batch(batch_from_sets(sets), compress=compress)


# ---------------------------------------------------------------- decode
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def decode_batch(data: bytes, max_inflated_bytes: int = 64 * 1024 * 1024) -> PatternBatch:
    """Parse and validate a columnar body. SchemaError (WireVersionError for a foreign format
    version) names what is wrong; nothing is unpickled."""
    if len(data) < HEADER.size:
        raise SchemaError(f"patterns batch: {len(data)} bytes, shorter than its {HEADER.size}-byte header")
    magic, version, flags, table_len, meta_len, rows = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SchemaError(f"patterns batch: not a perftracker columnar body (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise WireVersionError(f"patterns batch: format version {version} is not supported (this perftracker "
                               f"reads version {FORMAT_VERSION}); upload JSON or upgrade the localizer")
    if flags & ~FLAG_ZLIB:
        raise SchemaError(f"patterns batch: unknown flags {flags:#x}")
    mid = HEADER.size + table_len
    end = mid + meta_len
    if end > len(data):
        raise SchemaError(f"patterns batch: table and meta of {table_len} + {meta_len} bytes run past the body "
                          f"({len(data)} bytes)")
    want = rows * ROW_BYTES
    if want > max_inflated_bytes:
        raise SchemaError(f"patterns batch: {rows} rows are more than {max_inflated_bytes} bytes")
    arrays = memoryview(data)[end:]
    if flags & FLAG_ZLIB:
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(arrays, want + 1)
        except zlib.error as exc:
            raise SchemaError(f"patterns batch: array section is not zlib data ({exc})") from None
        if inflater.unconsumed_tail or len(raw) != want or not inflater.eof:
            raise SchemaError(f"patterns batch: array section does not inflate to {rows} rows ({want} bytes)")
        arrays = memoryview(raw)
    elif len(arrays) != want:
        raise SchemaError(f"patterns batch: array section of {len(arrays)} bytes, expected {want} for {rows} rows")
    where = "patterns batch"
    keys, labels, cats, res = _table(bytes(data[HEADER.size:mid]), where)
    meta = _load(bytes(data[mid:end]), f"{where}: meta")
    check_schema_version(meta, where)
    job = require(meta, "job", str, where)
    session = require(meta, "session", str, where)
    workers, counts = _workers(meta, where)
    if sum(counts) != rows:
        raise SchemaError(f"{where}: the workers' rows add up to {sum(counts)}, the header says {rows}")
    o = 0
    fidx = np.frombuffer(arrays, dtype="<i4", count=rows, offset=o).astype(np.int32)
    o += 4 * rows
    micro = np.frombuffer(arrays, dtype="<u4", count=3 * rows, offset=o).reshape(rows, 3)
    o += 12 * rows
    executions = np.frombuffer(arrays, dtype="<i8", count=rows, offset=o).astype(np.int64)
    o += 8 * rows
    critical_ns = np.frombuffer(arrays, dtype="<i8", count=rows, offset=o).astype(np.int64)
    offsets = np.zeros(len(workers) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    _check_rows(fidx, micro, offsets, len(keys), [w.rank for w in workers], keys, where)
    values = micro.astype(np.float64) / MICRO  # k / 1e6 is round(x, 6) exactly: the JSON form's value
    return PatternBatch(job, session, tuple(workers), keys, labels, cats, res, offsets, fidx, values, executions,
                        critical_ns)


def _load(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise SchemaError(f"{what} is not valid JSON ({exc})") from None


def _table(raw: bytes, where: str) -> tuple[Any, ...]:
    """The parsed function table, once per distinct table (the nodes of a job send the same one)."""
    with _TABLES_LOCK:
        hit = _TABLES.get(raw)
    if hit is not None:
        return hit
    parsed = _functions(_load(raw, f"{where}: function table"), where)
    with _TABLES_LOCK:
        if len(_TABLES) >= _MAX_TABLES:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[raw] = parsed
    return parsed


def _functions(meta: Mapping[str, Any], where: str) -> tuple[tuple[str, ...], tuple[str, ...],
                                                              tuple[Category, ...], tuple[str, ...]]:
    frames = optional(meta, "frames", list, where, [])
    if not all(type(f) is str for f in frames):
        raise SchemaError(f"{where}.frames: expected strings")
    table = require(meta, "functions", list, where)
    keys, labels, cats, res = [], [], [], []
    for i, row in enumerate(table):
        w = f"{where}.functions[{i}]"
        if type(row) is not list or len(row) != 4:
            raise SchemaError(f"{w}: expected [key, category, label, resource]")
        key, cat, label, resource = row
        if type(key) is list:
            try:
                key = ";".join([frames[j] for j in key])
            except (IndexError, TypeError):
                raise SchemaError(f"{w}: bad frame index in stack") from None
        category = _CATEGORIES.get(cat) if type(cat) is str else None
        if category is None:
            raise SchemaError(f"{w}: unknown category {cat!r:.40}")
        if type(key) is not str or not key:
            raise SchemaError(f"{w}: function key must be a non-empty string")
        if type(label) is not str or type(resource) is not str:
            raise SchemaError(f"{w}: label and resource must be strings")
        keys.append(key)
        labels.append(label)
        cats.append(category)
        res.append(resource)
    if len(set(keys)) != len(keys):
        raise SchemaError(f"{where}.functions: a function key appears twice")
    return tuple(keys), tuple(labels), tuple(cats), tuple(res)


def _workers(meta: Mapping[str, Any], where: str) -> tuple[list[WorkerMeta], list[int]]:
    raw = require(meta, "workers", list, where)
    if not raw:
        raise SchemaError(f"{where}.workers: empty")
    workers, counts = [], []
    for i, d in enumerate(raw):
        fast = _worker_fast(d)
        if fast is not None:  # the well-formed worker (exact types), as the slow path would build it
            workers.append(fast[0])
            counts.append(fast[1])
            continue
        w = f"{where}.workers[{i}]"
        n = require(d, "rows", int, w)
        if n < 0:
            raise SchemaError(f"{w}.rows: negative")
        coords = optional(d, "coords", dict, w, {})
        for k, v in coords.items():
            if type(v) is not int:
                raise SchemaError(f"{w}.coords[{k!r:.40}]: not an integer: {v!r:.40}")
        iters = optional(d, "iteration_ms", list, w, [])
        for x in iters:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise SchemaError(f"{w}.iteration_ms: not a finite number: {x!r:.40}")
        workers.append(WorkerMeta(
            rank=require(d, "rank", int, w), world_size=require(d, "world_size", int, w),
            host=require(d, "host", str, w), window_start_ns=require(d, "window_start_ns", int, w),
            window_end_ns=require(d, "window_end_ns", int, w), local_rank=optional(d, "local_rank", int, w, -1),
            pid=optional(d, "pid", int, w, 0), coords={str(k): v for k, v in coords.items()},
            source=optional(d, "source", str, w, "online"), gpu=optional(d, "gpu", bool, w, False),
            iteration_ms=tuple(float(x) for x in iters), **_groups_fields(d, w),
            window_cost=window_cost_fields(optional(d, "window_cost", dict, w, {}), f"{w}.window_cost"),
            cpu_place=optional(d, "cpu_place", str, w, "")))
        counts.append(n)
    ranks = [w.rank for w in workers]
    if len(set(ranks)) != len(ranks):
        raise SchemaError(f"{where}.workers: a rank appears twice")
    return workers, counts


def _groups_fields(d: Mapping[str, Any], w: str) -> dict[str, Any]:
    """The process-group fields of a worker dict, checked as ``PatternSet.from_dict`` checks them."""
    if not any(k in d for k in ("groups", "comm", "steps_ms", "step_record")):
        return {}
    return parse_groups_fields(d, w)


_WORKER_KEYS = {"rank", "world_size", "host", "local_rank", "pid", "coords", "source", "gpu", "window_start_ns",
                "window_end_ns", "iteration_ms", "rows"}


def _worker_fast(d: Any) -> tuple[WorkerMeta, int] | None:
    """A worker dict with every field present and of its exact type, else None (the checked path)."""
    if type(d) is not dict or d.keys() != _WORKER_KEYS:
        return None
    ints = (d["rank"], d["world_size"], d["local_rank"], d["pid"], d["window_start_ns"], d["window_end_ns"], d["rows"])
    coords, iters = d["coords"], d["iteration_ms"]
    if (any(type(x) is not int for x in ints) or d["rows"] < 0 or type(d["host"]) is not str
            or type(d["source"]) is not str or type(d["gpu"]) is not bool or type(coords) is not dict
            or type(iters) is not list or any(type(v) is not int for v in coords.values())
            or any(type(x) is not float or not math.isfinite(x) for x in iters)):
        return None
    return WorkerMeta(d["rank"], d["world_size"], d["host"], d["window_start_ns"], d["window_end_ns"], d["local_rank"],
                      d["pid"], coords, d["source"], d["gpu"], tuple(iters)), d["rows"]


def _check_rows(fidx: np.ndarray, micro: np.ndarray, offsets: np.ndarray, n_functions: int,
                ranks: Sequence[int], keys: Sequence[str], where: str) -> None:
    rows = fidx.shape[0]
    if rows == 0:
        return
    if int(fidx.min()) < 0 or int(fidx.max()) >= n_functions:
        raise SchemaError(f"{where}: a row names function {int(fidx.max())} of {n_functions}")
    bad = micro > MICRO
    if bad.any():
        r, d = (int(i[0]) for i in np.nonzero(bad))
        w = int(np.searchsorted(offsets, r, side="right")) - 1
        raise SchemaError(f"{where}: rank {ranks[w]}: function {keys[int(fidx[r])]!r} has "
                          f"{('beta', 'mu', 'sigma')[d]} = {int(micro[r, d]) / MICRO!r}, outside [0, 1]")
    rising = np.diff(fidx) > 0
    starts = offsets[1:-1]
    rising[starts[(starts > 0) & (starts < rows)] - 1] = True  # a new rank may start anywhere
    if rising.all():  # each rank's functions in table order (what the encoder writes): no repeats
        return
    owner = np.repeat(np.arange(len(ranks), dtype=np.int64), np.diff(offsets))
    pair = owner * n_functions + fidx
    if np.unique(pair).shape[0] != rows:
        raise SchemaError(f"{where}: a function appears twice in one rank's patterns")


def select_ranks(batch: PatternBatch, ranks: set[int]) -> PatternBatch:
    """The part of ``batch`` that holds ``ranks`` (its function table unchanged)."""
    keep = [i for i, w in enumerate(batch.workers) if w.rank in ranks]
    counts = np.diff(batch.offsets)
    row_keep = np.repeat(np.isin(np.arange(len(batch.workers)), keep), counts)
    offsets = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(counts[keep], out=offsets[1:])
    return PatternBatch(batch.job, batch.session, tuple(batch.workers[i] for i in keep), batch.keys, batch.labels,
                        batch.categories, batch.resources, offsets, batch.fidx[row_keep], batch.values[row_keep],
                        batch.executions[row_keep], batch.critical_ns[row_keep])
