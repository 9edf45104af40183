"""The store's pattern tables: uploads kept in their columnar wire form (``perftracker.wire.patterns``).

``pattern_batches`` holds each accepted upload (one node's ranks) as the validated columnar bytes;
``patterns`` holds one row per (session, rank) naming the batch that has the rank's latest patterns
(``batch``), so a repeat upload of a rank replaces the old one. Rows written before the columnar
form (``batch`` 0) hold the rank's zlib JSON in ``body`` and are still read. Nothing is unpickled.

``PatternTables`` is a part of ``perftracker.localizer.store.sqlite_store.Store``, which owns it
and hands it its transaction and read query (perftracker.localizer.store.access).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence

from perftracker.localizer.store.access import Query, Transaction
from perftracker.localizer.store.records import STORE_SCHEMA_VERSION

from perftracker.model import PatternSet
from perftracker.wire.patterns import (
    PatternBatch,
    batch_from_sets,
    batch_to_sets,
    decode_batch,
    encode_batch,
)

PATTERN_DDL = """
CREATE TABLE IF NOT EXISTS patterns (
    session TEXT NOT NULL, rank INTEGER NOT NULL, body BLOB NOT NULL, received_ns INTEGER NOT NULL,
    schema_version INTEGER NOT NULL, batch INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (session, rank));
CREATE TABLE IF NOT EXISTS pattern_batches (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL, ranks TEXT NOT NULL, body BLOB NOT NULL,
    received_ns INTEGER NOT NULL, schema_version INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS pattern_batches_session ON pattern_batches (session, id);
"""


def add_pattern_columns(db: sqlite3.Connection) -> None:
    """Columns added to the pattern tables after schema 1 was released (older stores gain them on open)."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(patterns)")}
    if "batch" not in cols:  # a store from before the columnar form
        db.execute("ALTER TABLE patterns ADD COLUMN batch INTEGER NOT NULL DEFAULT 0")


class PatternTables:
    """The Store's pattern tables (see the module docstring)."""

    def __init__(self, tx: Transaction, query: Query) -> None:
        self._tx = tx
        self._query = query

    def put_batches(self, items: Sequence[tuple[PatternBatch, bytes]], now_ns: int) -> None:
        """Persist uploads in one transaction: ``body`` is the validated columnar bytes of ``batch``."""
        with self._tx() as db:
            for batch, body in items:
                cur = db.execute("INSERT INTO pattern_batches (session, ranks, body, received_ns, schema_version) "
                                 "VALUES (?,?,?,?,?)", (batch.session, json.dumps(batch.ranks), body, now_ns,
                                                        STORE_SCHEMA_VERSION))
                bid = int(cur.lastrowid or 0)
                db.executemany("INSERT OR REPLACE INTO patterns (session, rank, body, received_ns, schema_version, "
                               "batch) VALUES (?,?,?,?,?,?)",
                               [(batch.session, r, b"", now_ns, STORE_SCHEMA_VERSION, bid) for r in batch.ranks])

    def put_patterns(self, ps: PatternSet, now_ns: int, body: bytes | None = None) -> None:
        """Persist one worker's patterns (a repeat upload of the same rank replaces the old one)."""
        self.put_patterns_many([(ps, body)], now_ns)

    def put_patterns_many(self, items: Sequence[tuple[PatternSet, bytes | None]], now_ns: int) -> None:
        """Persist several PatternSets in one transaction, each as a columnar batch of its own."""
        batches = [batch_from_sets([ps]) for ps, _ in items]
        self.put_batches([(b, encode_batch(b)) for b in batches], now_ns)

    def pattern_ranks(self, session: str) -> list[int]:
        return [r[0] for r in self._query("SELECT rank FROM patterns WHERE session=? ORDER BY rank", (session,))]

    def pattern_batches(self, session: str) -> Iterator[tuple[PatternBatch, set[int]]]:
        """The session's stored uploads, oldest first, each with the ranks it still holds (a later
        upload of a rank replaces it). Rows from before the columnar form come as batches too."""
        live: dict[int, set[int]] = {}
        for rank, bid in self._query("SELECT rank, batch FROM patterns WHERE session=?", (session,)):
            live.setdefault(int(bid), set()).add(int(rank))
        legacy = live.pop(0, set())
        if legacy:
            rows = self._query("SELECT rank, body FROM patterns WHERE session=? AND batch=0 ORDER BY rank", (session,))
            yield batch_from_sets([PatternSet.from_bytes(bytes(body)) for _, body in rows]), legacy
        ids = sorted(live)
        for i in range(0, len(ids), 256):  # a page at a time: bounded memory
            chunk = ids[i:i + 256]
            rows = self._query(f"SELECT id, body FROM pattern_batches WHERE id IN ({','.join('?' * len(chunk))}) "
                               "ORDER BY id", chunk)
            for bid, body in rows:
                yield decode_batch(bytes(body)), live[int(bid)]

    def pattern_sets(self, session: str, skip: Sequence[int] = ()) -> list[PatternSet]:
        """The session's stored PatternSets by rank, leaving out the ranks in ``skip`` (tools and tests;
        the localizer reads ``pattern_batches``)."""
        leave = set(skip)
        out = [ps for batch, ranks in self.pattern_batches(session) for ps in batch_to_sets(batch)
               if ps.rank in ranks and ps.rank not in leave]
        return sorted(out, key=lambda ps: ps.rank)
