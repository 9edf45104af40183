"""A session's patterns kept columnar: per-function arrays appended per upload, read as PatternArrays.

Each accepted upload (a ``PatternBatch``, parsed once on arrival) is appended as one chunk: the
session-wide function index of each row, the worker slot of each row, and the (β, μ, σ) values.
A rank that uploads again gets a new slot; the old one is left out when the arrays are built.
``to_arrays`` builds exactly what ``perftracker.localizer.diagnose.method.arrays.pattern_sets_to_arrays`` builds from the same
PatternSets sorted by rank (same function order, same values), without a Python object per pattern.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np
from perftracker.localizer.diagnose.method.arrays import (
    FunctionInfo,
    PatternArrays,
    cpu_places,
    job_groups,
    stages,
    step_records,
)

from perftracker.errors import InputError
from perftracker.model import Category
from perftracker.model.window_cost import worst_of
from perftracker.wire.patterns import PatternBatch, WorkerMeta, select_ranks

ROW_BYTES = 4 + 4 + 24  # function index, worker slot, three float64 per stored row


class SessionColumns:
    """One session's uploads as arrays (thread-safe: the writer appends, the localizer reads)."""

    def __init__(self, job: str, session: str) -> None:
        self.job = job
        self.session = session
        self._lock = threading.Lock()
        self._index: dict[str, int] = {}
        self._keys: list[str] = []
        self._labels: list[str] = []
        self._cats: list[Category] = []
        self._res: list[str] = []
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (f, slot, values (M, 3))
        self._workers: list[WorkerMeta] = []  # slot -> the rank's identity and window
        self._where: list[tuple[int, int, int]] = []  # slot -> (chunk, first row, end row) in that chunk
        self._slot_of: dict[int, int] = {}  # rank -> its latest slot
        self.rows = 0

    @property
    def nbytes(self) -> int:
        return self.rows * ROW_BYTES + 512 * len(self._workers) + 256 * len(self._keys)

    def ranks(self) -> set[int]:
        with self._lock:
            return set(self._slot_of)

    def check(self, batch: PatternBatch) -> None:
        """InputError when a function of ``batch`` has another category than on the session's other ranks."""
        with self._lock:
            self._check(batch)

    def _check(self, batch: PatternBatch) -> None:
        for key, cat in zip(batch.keys, batch.categories, strict=True):
            f = self._index.get(key)
            if f is not None and self._cats[f] is not cat:
                raise InputError(f"rank(s) {batch.ranks}: function {key!r} has category {cat.value!r}, "
                                 f"other ranks say {self._cats[f].value!r}")

    def add(self, batch: PatternBatch, ranks: set[int] | None = None) -> None:
        """Append one upload (its ranks replace their earlier uploads); ``ranks``: only these of
        its ranks. InputError as ``check``."""
        if ranks is not None and not set(batch.ranks) <= ranks:
            batch = select_ranks(batch, ranks)
        with self._lock:
            self._check(batch)
            fmap = np.empty(len(batch.keys), dtype=np.int32)
            for i, key in enumerate(batch.keys):
                f = self._index.get(key)
                if f is None:
                    f = self._index[key] = len(self._keys)
                    self._keys.append(key)
                    self._labels.append(batch.labels[i] or key.rsplit(";", 1)[-1])
                    self._cats.append(batch.categories[i])
                    self._res.append(batch.resources[i])
                fmap[i] = f
            first = len(self._workers)
            for j, w in enumerate(batch.workers):
                self._slot_of[w.rank] = first + j
                self._where.append((len(self._chunks), int(batch.offsets[j]), int(batch.offsets[j + 1])))
            self._workers.extend(batch.workers)
            slots = np.repeat(np.arange(first, first + len(batch.workers), dtype=np.int32),
                              np.diff(batch.offsets))
            self._chunks.append((fmap[batch.fidx], slots, batch.values))
            self.rows += batch.rows

    def to_arrays(self) -> PatternArrays:
        """All live ranks as PatternArrays, columns in rank order. InputError when there are none.

        The uploads are scattered into the (F, 3, N) values a group of chunks at a time (bounded
        temporaries); the function order is found by walking the ranks in order until every
        function with a live row has been seen (usually the first rank has them all)."""
        with self._lock:
            if not self._slot_of:
                raise InputError("no pattern sets to localize (an empty set)")
            live = sorted(self._slot_of.items())  # (rank, slot) by rank
            chunks = list(self._chunks)
            workers = list(self._workers)
            where = list(self._where)
            keys, labels, cats, res = list(self._keys), list(self._labels), list(self._cats), list(self._res)
        n = len(live)
        col_of_slot = np.full(len(workers), -1, dtype=np.int64)
        col_of_slot[np.array([s for _, s in live], dtype=np.int64)] = np.arange(n, dtype=np.int64)
        groups = []
        present = np.zeros(len(keys), dtype=bool)
        for i in range(0, len(chunks), _GROUP):
            part = chunks[i:i + _GROUP]
            f = np.concatenate([c[0] for c in part]) if len(part) > 1 else part[0][0]
            col = col_of_slot[np.concatenate([c[1] for c in part]) if len(part) > 1 else part[0][1]]
            vals = np.concatenate([c[2] for c in part]) if len(part) > 1 else part[0][2]
            keep = col >= 0
            if not keep.all():  # rows of replaced uploads
                f, col, vals = f[keep], col[keep], vals[keep]
            present[f] = True
            groups.append((f, col, vals))
        order = _first_seen_order(present, [where[s] for _, s in live], chunks, groups)
        n_f = int(present.sum())
        values = np.zeros((n_f, 3, n), dtype=np.float64)
        flat = values.reshape(-1)
        for f, col, vals in groups:
            base = order[f] * (3 * n) + col
            flat[base] = vals[:, 0]
            base += n
            flat[base] = vals[:, 1]
            base += n
            flat[base] = vals[:, 2]
        funcs: list[FunctionInfo | None] = [None] * n_f
        for g in np.flatnonzero(present).tolist():
            funcs[int(order[g])] = FunctionInfo(keys[g], labels[g], cats[g], res[g])
        metas = [workers[s] for _, s in live]
        return _arrays(self.job, self.session, metas, tuple(funcs), values)  # type: ignore[arg-type]


_GROUP = 256  # chunks (uploads) scattered together


def _first_seen_order(present: np.ndarray, spans: list[tuple[int, int, int]],
                      chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                      groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
    """Each session function's position in first-seen order over the live ranks (rank order) and,
    within a rank, row order, as ``pattern_sets_to_arrays`` numbers them; -1 for functions no live
    row has. ``spans``: each live rank's (chunk, first row, end row), in rank order. The first
    ranks are walked in Python (they usually hold every function); functions first seen later
    are placed by their smallest (column, row) over the groups' rows, vectorized."""
    out = np.full(present.shape[0], -1, dtype=np.int64)
    want = int(present.sum())
    seen = 0
    for chunk, a, b in spans[:_WALK]:
        for g in chunks[chunk][0][a:b].tolist():
            if out[g] < 0:
                out[g] = seen
                seen += 1
    if seen == want:
        return out
    late = present & (out < 0)
    big = sum(int(f.shape[0]) for f, _, _ in groups) + 1  # > any row index: (column, row) as one number
    first = np.full(present.shape[0], np.iinfo(np.int64).max, dtype=np.int64)
    offset = 0
    for f, col, _ in groups:
        mask = late[f]
        if mask.any():
            rows = np.flatnonzero(mask)
            np.minimum.at(first, f[rows], col[rows] * big + offset + rows)
        offset += int(f.shape[0])
    later = np.flatnonzero(late)
    out[later[np.argsort(first[later], kind="stable")]] = np.arange(seen, want, dtype=np.int64)
    return out


_WALK = 4  # ranks walked in Python before the vectorized search


def _arrays(job: str, session: str, workers: list[WorkerMeta], funcs: tuple[FunctionInfo, ...],
            values: np.ndarray) -> PatternArrays:
    starts = np.array([w.window_start_ns for w in workers], dtype=np.int64)
    ends = np.array([w.window_end_ns for w in workers], dtype=np.int64)
    groups = job_groups(workers)  # the process groups the workers' windows read (issue 28)
    return PatternArrays(
        job=job, session=session, ranks=np.array([w.rank for w in workers], dtype=np.int64), functions=funcs,
        values=values, window_s=max(0.0, (float(np.median(ends)) - float(np.median(starts))) / 1e9),
        gpu=any(w.gpu for w in workers), world_size=max(w.world_size for w in workers),
        iteration_ms={w.rank: tuple(w.iteration_ms) for w in workers if w.iteration_ms},
        offline=all(w.source != "online" for w in workers),
        worker_window_s=np.maximum(0.0, (ends - starts) / 1e9), stage=stages(workers, groups), job_groups=groups,
        window_cost=worst_of([w.window_cost for w in workers]), step_records=step_records(workers),
        cpu_places=cpu_places(workers))


def columns_of(job: str, session: str, batches: Iterable[tuple[PatternBatch, set[int]]]) -> SessionColumns:
    """A session's columns from its stored uploads, oldest first, each with the ranks it still
    holds (``Store.pattern_batches``: after a restart or an eviction)."""
    cols = SessionColumns(job, session)
    for b, ranks in batches:
        cols.add(b, ranks)
    return cols


class ColumnCache:
    """session -> SessionColumns of the open sessions, bounded by ``max_bytes`` (thread-safe).

    Past the bound the least recently appended session is dropped and *spilled*: its later uploads
    are not kept either, and localizing it reads its arrays back from the store. So is a session
    this process did not see from its first upload (after a restart)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, SessionColumns] = OrderedDict()
        self._spilled: set[str] = set()
        self.evicted = 0

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._sessions.values())

    def get(self, session: str) -> SessionColumns | None:
        with self._lock:
            return self._sessions.get(session)

    def knows(self, session: str) -> bool:
        with self._lock:
            return session in self._sessions or session in self._spilled

    def spill(self, session: str) -> None:
        with self._lock:
            self._sessions.pop(session, None)
            self._spilled.add(session)

    def add(self, batch: PatternBatch, ranks: set[int] | None = None) -> None:
        """Append a committed upload to its session's columns (unless the session is spilled)."""
        with self._lock:
            if batch.session in self._spilled:
                return
            cols = self._sessions.get(batch.session)
            if cols is None:
                cols = self._sessions[batch.session] = SessionColumns(batch.job, batch.session)
            self._sessions.move_to_end(batch.session)
        cols.add(batch, ranks)
        with self._lock:
            total = sum(c.nbytes for c in self._sessions.values())
            while total > self.max_bytes and self._sessions:
                session, old = self._sessions.popitem(last=False)
                self._spilled.add(session)
                total -= old.nbytes
                self.evicted += 1

    def forget(self, session: str) -> None:
        with self._lock:
            self._sessions.pop(session, None)
            self._spilled.discard(session)
