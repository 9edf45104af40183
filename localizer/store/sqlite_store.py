"""The localizer's store: one sqlite file in WAL mode.

Every row carries ``schema_version``. Writes commit before the method returns, so the service
acknowledges an upload only after it is on disk (``synchronous=FULL``): a localizer restart, even a
``kill -9``, loses nothing that was acknowledged.

Tables: ``agents`` and ``workers`` (registrations), ``sessions``, ``pattern_batches`` (each upload's
columnar bytes) and ``patterns`` (which batch holds each rank's latest patterns:
``perftracker.localizer.store.pattern_store``), ``hang_snapshots``, ``heartbeats`` (latest per rank) and ``reports``
(``perftracker.localizer.store.event_store``), ``baselines`` (each job's healthy baseline:
``perftracker.localizer.store.baseline_store``) and ``culprits`` (hosts named as the culprit:
``perftracker.localizer.store.culprit_store``). The Store keeps the registrations and sessions and
owns two parts for the rest, ``patterns`` (``PatternTables``) and ``events`` (``EventTables``), which
share its connection and write through its transactions (perftracker.localizer.store.access). Nothing read back is unpickled: bodies are JSON, zlib-compressed JSON
or the columnar wire form, and are validated as they are on arrival.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from perftracker.localizer.store.baseline_store import BASELINE_DDL, BaselineTables
from perftracker.localizer.store.culprit_store import CULPRIT_DDL, CulpritTables
from perftracker.localizer.store.event_store import EventTables
from perftracker.localizer.store.pattern_store import (
    PATTERN_DDL,
    PatternTables,
    add_pattern_columns,
)
from perftracker.localizer.store.rank_ranges import RankRanges
from perftracker.localizer.store.records import (  # noqa: F401 - re-exported: the store's row types
    SESSION_COLUMNS,
    STORE_DDL,
    STORE_SCHEMA_VERSION,
    HeartbeatRecord,
    SessionRecord,
    WorkerRecord,
)

from perftracker.errors import PerftrackerError, SchemaError
from perftracker.model import HangSnapshot, PatternSet, Report
from perftracker.model.trigger import Detection
from perftracker.rundir import make_private_dir, open_private

log = logging.getLogger(__name__)


class StoreError(PerftrackerError):
    """The store file cannot be opened or written (disk full, wrong version, not a database)."""


class Store:
    """A thread-safe handle on one sqlite store. Every write commits before it returns.

    Session rows read outside a transaction are cached (parsing ``expected`` of a 100,000-rank job
    costs milliseconds, and every upload looks at its session): a cached row is dropped after each
    commit that changed it, and a read that raced such a commit is not cached."""

    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self._lock = threading.RLock()  # the write connection (and any open transaction)
        self._rlock = threading.Lock()  # the read connection
        self._local = threading.local()  # .depth: transactions this thread has open; .dirty: sessions it changed
        self._records: dict[str, SessionRecord] = {}  # committed session rows (without ``uploaded``)
        self._records_gen = 0  # bumped after each commit that changed a session row
        self._records_lock = threading.Lock()
        self._expected_memo: dict[str, tuple[str, RankRanges]] = {}  # session -> (JSON, parsed)
        self.patterns = PatternTables(self.transaction, self._query)  # uploads (columnar)
        self.events = EventTables(self.transaction, self._query)  # heartbeats, hang snapshots, reports
        self.baselines = BaselineTables(self.transaction, self._query)  # each job's healthy baseline (issue 49)
        self.culprits = CulpritTables(self.transaction, self._query)  # hosts named as the culprit (issue 49)
        try:
            make_private_dir(self.path.parent)  # 0700 when we create it
            self._private_files()  # 0600 (sqlite gives its -wal and -shm files the database's mode)
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None,
                                       timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.executescript(STORE_DDL + PATTERN_DDL + BASELINE_DDL + CULPRIT_DDL)
            self._check_version()
            self._add_columns()
            # WAL: readers see the last commit and never wait for a writer's fsync
            self._rdb = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None,
                                        timeout=30.0)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: cannot open the localizer store ({exc})") from None
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create the localizer store ({exc})") from None

    def _private_files(self) -> None:
        os.close(open_private(self.path, os.O_RDONLY))
        for suffix in ("", "-wal", "-shm", "-journal"):
            p = Path(str(self.path) + suffix)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_IMODE(os.lstat(p).st_mode) & 0o077:
                    os.chmod(p, 0o600, follow_symlinks=False)

    def _check_version(self) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(STORE_SCHEMA_VERSION),))
        elif int(row[0]) != STORE_SCHEMA_VERSION:
            raise SchemaError(f"{self.path}: store schema_version {row[0]} is not supported "
                              f"(this perftracker reads {STORE_SCHEMA_VERSION})")

    def _add_columns(self) -> None:
        """Columns added after schema 1 was released (additive: older stores gain them on open)."""
        if "detection" not in {r[1] for r in self._db.execute("PRAGMA table_info(sessions)")}:
            self._db.execute("ALTER TABLE sessions ADD COLUMN detection TEXT NOT NULL DEFAULT ''")
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(agents)")}
        if "key_hash" not in cols:
            self._db.execute("ALTER TABLE agents ADD COLUMN key_hash TEXT NOT NULL DEFAULT ''")
        add_pattern_columns(self._db)

    def close(self) -> None:
        with self._lock, self._rlock:
            self._rdb.close()
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction; nested calls on the same thread join the outer one (one commit, one fsync).
        Reads on this thread inside it see its own writes. Hooks registered with ``on_commit`` run
        after the commit succeeded, and never when it fails."""
        with self._lock:
            depth = getattr(self._local, "depth", 0)
            if depth:
                self._local.depth = depth + 1
                try:
                    yield self._db
                finally:
                    self._local.depth = depth
                return
            self._local.hooks = []
            self._local.dirty = set()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._local.depth = 1
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                finally:
                    self._local.depth = 0
                try:
                    self._db.execute("COMMIT")
                except sqlite3.Error:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:  # disk full, I/O error, locked
                self._local.hooks = []
                raise StoreError(f"{self.path}: write failed ({exc})") from None
            except BaseException:
                self._local.hooks = []
                raise
            hooks, self._local.hooks = self._local.hooks, []
            for hook in hooks:
                hook()

    _tx = transaction

    def on_commit(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` after this thread's open transaction commits (now, if none is open). In-memory
        views (upload counts) change only through here, so they never count a write that was lost."""
        if getattr(self._local, "depth", 0):
            self._local.hooks.append(hook)
        else:
            hook()

    def run_batch(self, fns: Sequence[Callable[[], Any]]) -> list[tuple[bool, Any]]:
        """Run writers in one transaction, each in its own savepoint: a failing one is rolled back
        alone (with its commit hooks). Returns (ok, result or exception) per writer, after the commit."""
        out: list[tuple[bool, Any]] = []
        with self.transaction() as db:
            for fn in fns:
                db.execute("SAVEPOINT item")
                n_hooks = len(self._local.hooks)
                try:
                    out.append((True, fn()))
                except Exception as exc:  # noqa: BLE001 - handed back to that writer's caller
                    db.execute("ROLLBACK TO item")
                    del self._local.hooks[n_hooks:]
                    out.append((False, exc))
                db.execute("RELEASE item")
        return out

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if getattr(self._local, "depth", 0):  # inside this thread's transaction: see its writes
            return self._db.execute(sql, tuple(args)).fetchall()
        with self._rlock:
            return self._rdb.execute(sql, tuple(args)).fetchall()

    # ---------------------------------------------------------------- registrations
    def register(self, job: str, agent_id: str, host: str, workers: Sequence[WorkerRecord],
                 now_ns: int, key_hash: str | None = None) -> None:
        """Store a registration; ``key_hash`` (the agent key's sha256) replaces the stored one if given."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO agents (job, agent_id, host, registered_ns, last_seen_ns, schema_version, key_hash) "
                "VALUES (?,?,?,?,?,?,?) ON CONFLICT(job, agent_id) DO UPDATE SET "
                "host=excluded.host, last_seen_ns=excluded.last_seen_ns"
                + (", key_hash=excluded.key_hash" if key_hash is not None else ""),
                (job, agent_id, host, now_ns, now_ns, STORE_SCHEMA_VERSION, key_hash or ""))
            db.executemany(
                "INSERT OR REPLACE INTO workers VALUES (?,?,?,?,?,?,?,?,?,?)",
                [(job, w.rank, agent_id, w.local_rank, w.world_size, w.pid, w.tid, w.host, now_ns,
                  STORE_SCHEMA_VERSION) for w in workers])

    def agent(self, job: str, agent_id: str) -> tuple[int, str] | None:
        """(last_seen_ns, key_hash) of a registered agent, or None."""
        rows = self._query("SELECT last_seen_ns, key_hash FROM agents WHERE job=? AND agent_id=?", (job, agent_id))
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

    def rank_owners(self, job: str, ranks: Sequence[int]) -> dict[int, str]:
        """rank -> the agent_id that registered it, for the given ranks that are registered."""
        return {int(r): str(a) for r, a in self._worker_column(job, "agent_id", ranks)}

    def workers(self, job: str) -> list[WorkerRecord]:
        rows = self._query("SELECT job, rank, agent_id, local_rank, world_size, pid, tid, host "
                           "FROM workers WHERE job=? ORDER BY rank", (job,))
        return [WorkerRecord(*r) for r in rows]

    def rank_worlds(self, job: str, ranks: Sequence[int]) -> dict[int, int]:
        """rank -> the world size it registered with, for the given ranks that are registered."""
        return {int(r): int(w) for r, w in self._worker_column(job, "world_size", ranks)}

    def _worker_column(self, job: str, column: str, ranks: Sequence[int]) -> list[tuple[Any, ...]]:
        """(rank, column) of the given registered ranks, queried 500 ranks at a time."""
        if column not in ("agent_id", "world_size"):  # a fixed column name, never data
            raise ValueError(f"not a worker column: {column!r}")
        wanted = [int(r) for r in ranks]
        rows: list[tuple[Any, ...]] = []
        for i in range(0, len(wanted), 500):
            chunk = wanted[i:i + 500]
            rows += self._query(f"SELECT rank, {column} FROM workers WHERE job=? AND rank IN "
                                f"({','.join('?' * len(chunk))})", (job, *chunk))
        return rows

    def world_size(self, job: str) -> int:
        """The largest world size the job's registrations name (0: none registered)."""
        rows = self._query("SELECT MAX(world_size) FROM workers WHERE job=?", (job,))
        return int(rows[0][0] or 0) if rows else 0

    def jobs(self) -> list[str]:
        return [r[0] for r in self._query("SELECT DISTINCT job FROM agents ORDER BY job")]

    def touch_agent(self, job: str, agent_id: str, now_ns: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE agents SET last_seen_ns=? WHERE job=? AND agent_id=?", (now_ns, job, agent_id))

    # ---------------------------------------------------------------- sessions
    def insert_session(self, s: SessionRecord) -> SessionRecord:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO sessions (session, job, kind, reason, window_s, state, opened_ns, "
                "deadline_ns, closed_ns, expected, joins, error, schema_version, detection) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (s.session, s.job, s.kind, s.reason, s.window_s, s.state, s.opened_ns, s.deadline_ns,
                 s.closed_ns, json.dumps(s.expected.to_json()), s.joins, s.error, STORE_SCHEMA_VERSION,
                 json.dumps(s.detection.to_dict()) if s.detection is not None else ""))
            seq = int(cur.lastrowid or 0)
            self._changed(s.session)
        return dataclasses.replace(s, seq=seq)

    def update_session(self, session: str, **values: Any) -> None:
        allowed = {"kind", "state", "deadline_ns", "closed_ns", "expected", "joins", "error"}
        bad = set(values) - allowed
        if bad:
            raise ValueError(f"cannot update session fields {sorted(bad)}")
        if "expected" in values:
            exp = values["expected"]
            values["expected"] = json.dumps((exp if isinstance(exp, RankRanges) else RankRanges.of(exp)).to_json())
        cols = ", ".join(f"{k}=?" for k in values)
        with self._tx() as db:
            db.execute(f"UPDATE sessions SET {cols} WHERE session=?", (*values.values(), session))
            self._changed(session)

    def _changed(self, session: str) -> None:
        """Inside a transaction: this session's row changed (read it from the db until the commit;
        after the commit the cached row is dropped)."""
        self._local.dirty.add(session)

        def drop() -> None:
            with self._records_lock:
                self._records_gen += 1
                self._records.pop(session, None)

        self.on_commit(drop)

    def expect_ranks(self, session: str, ranks: Sequence[int]) -> tuple[SessionRecord, tuple[int, ...]] | None:
        """An open session also expects ``ranks`` (read and update in one transaction).

        Returns (session after the update, the ranks it added), or None if the session is unknown
        or no longer open."""
        with self._tx():
            s = self.get_session(session, with_uploaded=False)
            if s is None or s.state != "open":
                return None
            added = tuple(sorted({int(r) for r in ranks if int(r) not in s.expected}))
            if not added:
                return s, ()
            expected = s.expected | added
            self.update_session(session, expected=expected)
            return dataclasses.replace(s, expected=expected), added

    def _expected(self, session: str, text: str) -> RankRanges:
        """``expected`` parsed once per distinct JSON text of a session (ranges; a store written
        before them holds a list of ranks, read as well)."""
        memo = self._expected_memo.get(session)
        if memo is not None and memo[0] == text:
            return memo[1]
        parsed = RankRanges.from_json(json.loads(text))
        if len(self._expected_memo) > 256:
            self._expected_memo.clear()
        self._expected_memo[session] = (text, parsed)
        return parsed

    def _session_from_row(self, r: tuple[Any, ...], with_uploaded: bool = True) -> SessionRecord:
        uploaded = tuple(sorted(self.uploaded_ranks(r[1]))) if with_uploaded else ()
        return SessionRecord(seq=r[0], session=r[1], job=r[2], kind=r[3], reason=r[4], window_s=r[5],
                             state=r[6], opened_ns=r[7], deadline_ns=r[8], closed_ns=r[9],
                             expected=self._expected(r[1], r[10]), joins=r[11], error=r[12],
                             uploaded=uploaded, detection=_detection(r[13]))

    def get_session(self, session: str, *, with_uploaded: bool = True) -> SessionRecord | None:
        """One session; ``with_uploaded=False`` skips the uploaded-ranks query (``uploaded`` is empty)."""
        s = self._session_record(session)
        if s is None or not with_uploaded:
            return s
        return dataclasses.replace(s, uploaded=tuple(sorted(self.uploaded_ranks(session))))

    def _session_record(self, session: str) -> SessionRecord | None:
        in_tx = getattr(self._local, "depth", 0)
        if not in_tx or session not in self._local.dirty:
            with self._records_lock:
                cached = self._records.get(session)
                gen = self._records_gen
            if cached is not None:
                return cached
        rows = self._query(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE session=?", (session,))
        s = self._session_from_row(rows[0], False) if rows else None
        if s is not None and not (in_tx and session in self._local.dirty):
            with self._records_lock:
                if self._records_gen == gen:  # no commit changed a session meanwhile
                    if len(self._records) > 4096:
                        self._records.clear()
                    self._records[session] = s
        return s

    def next_open(self, job: str, after_seq: int = 0) -> tuple[str, float, str, str] | None:
        """(session, window_s, reason, kind) of the job's first open session after ``after_seq``
        (the long poll's question, without reading ``expected``)."""
        rows = self._query("SELECT session, window_s, reason, kind FROM sessions WHERE job=? AND state='open' "
                           "AND seq > ? ORDER BY seq LIMIT 1", (job, after_seq))
        return (str(rows[0][0]), float(rows[0][1]), str(rows[0][2]), str(rows[0][3])) if rows else None

    def uploaded_ranks(self, session: str) -> set[int]:
        """Ranks with patterns or a hang snapshot in the session."""
        return {x[0] for x in self._query("SELECT rank FROM patterns WHERE session=? UNION "
                                          "SELECT rank FROM hang_snapshots WHERE session=?", (session, session))}

    def sessions(self, job: str | None = None, states: Sequence[str] = (), after_seq: int = 0,
                 limit: int = 1000, *, with_uploaded: bool = True, before_seq: int | None = None,
                 newest_first: bool = False) -> list[SessionRecord]:
        """One page of sessions (``limit`` at most): by ``seq`` after ``after_seq``, or with
        ``newest_first`` the newest before ``before_seq``. ``iter_sessions`` walks every page."""
        sql = f"SELECT {SESSION_COLUMNS} FROM sessions WHERE seq > ?"
        args: list[Any] = [after_seq]
        if before_seq is not None:
            sql += " AND seq < ?"
            args.append(before_seq)
        if job is not None:
            sql += " AND job=?"
            args.append(job)
        if states:
            sql += f" AND state IN ({','.join('?' * len(states))})"
            args.extend(states)
        sql += f" ORDER BY seq {'DESC' if newest_first else 'ASC'} LIMIT ?"
        args.append(limit)
        return [self._session_from_row(r, with_uploaded) for r in self._query(sql, args)]

    def session_sizes(self) -> list[tuple[str, str, int, int, str]]:
        """(session, state, closed_ns or opened_ns, stored bytes, job) of every session, oldest first:
        what retention weighs (perftracker.localizer.service.retention). Bytes are the rows' bodies."""
        rows = self._query(
            "SELECT s.session, s.state, CASE WHEN s.closed_ns > 0 THEN s.closed_ns ELSE s.opened_ns END, "
            "LENGTH(s.expected) + LENGTH(s.reason) + LENGTH(s.error) + 128"
            " + COALESCE((SELECT SUM(LENGTH(body)) FROM patterns p WHERE p.session = s.session), 0)"
            " + COALESCE((SELECT SUM(LENGTH(body)) FROM pattern_batches b WHERE b.session = s.session), 0)"
            " + COALESCE((SELECT SUM(LENGTH(body)) FROM hang_snapshots h WHERE h.session = s.session), 0)"
            " + COALESCE((SELECT LENGTH(body) FROM reports r WHERE r.session = s.session), 0), s.job "
            "FROM sessions s ORDER BY s.seq")
        return [(str(r[0]), str(r[1]), int(r[2]), int(r[3]), str(r[4])) for r in rows]

    def delete_sessions(self, sessions: Sequence[str]) -> int:
        """Delete closed sessions with everything stored for them (patterns, snapshots, report).
        An open or localizing session is kept. Returns how many were deleted."""
        n = 0
        with self._tx() as db:
            for session in sessions:
                cur = db.execute("DELETE FROM sessions WHERE session=? AND state IN ('done', 'failed')", (session,))
                if not cur.rowcount:
                    continue
                n += 1
                for table in ("patterns", "pattern_batches", "hang_snapshots", "reports"):
                    db.execute(f"DELETE FROM {table} WHERE session=?", (session,))
                self._expected_memo.pop(session, None)
                self._changed(session)
        return n

    def open_count(self, job: str) -> int:
        """The job's sessions open or being localized (the per-job cap: job_limits)."""
        rows = self._query("SELECT COUNT(*) FROM sessions WHERE job=? AND state IN ('open', 'localizing')", (job,))
        return int(rows[0][0]) if rows else 0

    def session_counts(self) -> dict[tuple[str, str], int]:
        """Sessions by (state, kind): the localizer's /metrics."""
        return {(str(st), str(k)): int(n) for st, k, n in
                self._query("SELECT state, kind, COUNT(*) FROM sessions GROUP BY state, kind")}

    def iter_sessions(self, job: str | None = None, states: Sequence[str] = (), *, with_uploaded: bool = True,
                      page: int = 1000) -> Iterator[SessionRecord]:
        """Every matching session, oldest first, a page at a time."""
        after = 0
        while True:
            rows = self.sessions(job=job, states=states, after_seq=after, limit=page, with_uploaded=with_uploaded)
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1].seq

    # ---------------------------------------------------------------- the parts' tables, by their usual names
    def put_patterns(self, ps: PatternSet, now_ns: int, body: bytes | None = None) -> None:
        self.patterns.put_patterns(ps, now_ns, body)

    def pattern_ranks(self, session: str) -> list[int]:
        return self.patterns.pattern_ranks(session)

    def pattern_sets(self, session: str, skip: Sequence[int] = ()) -> list[PatternSet]:
        return self.patterns.pattern_sets(session, skip)

    def put_heartbeats(self, beats: Sequence[HeartbeatRecord]) -> None:
        self.events.put_heartbeats(beats)

    def heartbeats(self, job: str) -> list[HeartbeatRecord]:
        return self.events.heartbeats(job)

    def put_hang_snapshot(self, snap: HangSnapshot, session: str, now_ns: int) -> None:
        self.events.put_hang_snapshot(snap, session, now_ns)

    def hang_snapshots(self, session: str) -> list[HangSnapshot]:
        return self.events.hang_snapshots(session)

    def put_report(self, report: Report) -> None:
        self.events.put_report(report)

    def get_report(self, session: str) -> Report | None:
        return self.events.get_report(session)

    def get_report_dict(self, session: str) -> dict[str, Any] | None:
        return self.events.get_report_dict(session)


def _detection(text: str) -> Detection | None:
    """A session's stored detection ('' for none); one that cannot be read is left out (logged)."""
    if not text:
        return None
    try:
        return Detection.from_dict(json.loads(text), "session.detection")
    except (ValueError, SchemaError) as exc:
        log.warning("a session's stored detection is unreadable (%s); its report shows the reason only", exc)
        return None
