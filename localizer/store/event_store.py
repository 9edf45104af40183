"""The store's heartbeats, hang snapshots and reports tables.

``EventTables`` is a part of ``perftracker.localizer.store.sqlite_store.Store``, which owns it and
hands it its transaction and read query (perftracker.localizer.store.access). Bodies are JSON and
go through the model's ``from_dict``; nothing read back is unpickled.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from perftracker.localizer.store.access import Query, Transaction
from perftracker.localizer.store.records import STORE_SCHEMA_VERSION, HeartbeatRecord

from perftracker.model import HangSnapshot, Report
from perftracker.wire import strict_json


class EventTables:
    """The Store's heartbeat, hang snapshot and report tables (see the module docstring)."""

    def __init__(self, tx: Transaction, query: Query) -> None:
        self._tx = tx
        self._query = query

    # ---------------------------------------------------------------- heartbeats
    def put_heartbeats(self, beats: Sequence[HeartbeatRecord]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO heartbeats VALUES (?,?,?,?,?,?,?,?,?,?)",
                [(b.job, b.rank, b.agent_id, b.iteration, b.phase, b.last_event_age_s, int(b.alive),
                  b.iteration_ms, b.received_ns, STORE_SCHEMA_VERSION) for b in beats])

    def heartbeats(self, job: str) -> list[HeartbeatRecord]:
        rows = self._query("SELECT job, rank, agent_id, iteration, phase, last_event_age_s, alive, "
                           "iteration_ms, received_ns FROM heartbeats WHERE job=? ORDER BY rank", (job,))
        return [HeartbeatRecord(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], r[8]) for r in rows]

    # ---------------------------------------------------------------- hang snapshots
    def put_hang_snapshot(self, snap: HangSnapshot, session: str, now_ns: int) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO hang_snapshots (job, session, rank, taken_ns, body, received_ns, "
                       "schema_version) VALUES (?,?,?,?,?,?,?)",
                       (snap.job, session, snap.rank, snap.taken_ns, strict_json.dumps(snap.to_dict()), now_ns,
                        STORE_SCHEMA_VERSION))

    def hang_snapshots(self, session: str) -> list[HangSnapshot]:
        """The latest snapshot per rank for a session."""
        rows = self._query("SELECT rank, body FROM hang_snapshots WHERE session=? ORDER BY id", (session,))
        latest: dict[int, str] = {}
        for rank, body in rows:
            latest[rank] = body
        return [HangSnapshot.from_dict(json.loads(latest[r])) for r in sorted(latest)]

    # ---------------------------------------------------------------- reports
    def put_report(self, report: Report) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO reports VALUES (?,?,?,?,?,?,?)",
                       (report.session, report.job, report.kind, report.status, report.created_ns,
                        strict_json.dumps(report.to_dict()), STORE_SCHEMA_VERSION))

    def get_report(self, session: str) -> Report | None:
        rows = self._query("SELECT body FROM reports WHERE session=?", (session,))
        return Report.from_dict(json.loads(rows[0][0])) if rows else None

    def get_report_dict(self, session: str) -> dict[str, Any] | None:
        rows = self._query("SELECT body FROM reports WHERE session=?", (session,))
        return json.loads(rows[0][0]) if rows else None
