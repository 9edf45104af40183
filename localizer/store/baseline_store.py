"""The store's baselines table: each job's healthy baseline, one row per rank (issue 49).

A baseline is the pattern sets of one window taken while the job ran at its normal speed
(perftracker.localizer.service.session.baseline), kept per *job name*: a job that restarts under
the same name keeps it, and retention (which deletes sessions) leaves it alone. ``forget`` drops it
so that the next steady window is taken as the new one (``perftracker baseline JOB --retake``).
Bodies are the PatternSets' compressed JSON (``PatternSet.to_bytes``, a few KB per rank), read back
through ``PatternSet.from_bytes`` (validated; nothing unpickled). A part of
``perftracker.localizer.store.sqlite_store.Store`` (perftracker.localizer.store.access).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from perftracker.localizer.store.access import Query, Transaction
from perftracker.localizer.store.records import STORE_SCHEMA_VERSION

from perftracker.errors import SchemaError
from perftracker.model import PatternSet

log = logging.getLogger(__name__)

BASELINE_DDL = """
CREATE TABLE IF NOT EXISTS baselines (
    job TEXT NOT NULL, rank INTEGER NOT NULL, session TEXT NOT NULL, taken_ns INTEGER NOT NULL,
    body BLOB NOT NULL, schema_version INTEGER NOT NULL, PRIMARY KEY (job, rank));
"""


@dataclass(frozen=True)
class BaselineInfo:
    """A job's baseline without its bodies: what ``perftracker baseline`` lists."""

    job: str
    session: str
    taken_ns: int
    ranks: int
    bytes: int

    def to_dict(self) -> dict[str, object]:
        return {"job": self.job, "session": self.session, "taken_ns": self.taken_ns, "ranks": self.ranks,
                "bytes": self.bytes}


class BaselineTables:
    """The Store's baselines (see the module docstring)."""

    def __init__(self, tx: Transaction, query: Query) -> None:
        self._tx = tx
        self._query = query

    def put(self, job: str, session: str, taken_ns: int, sets: Sequence[PatternSet]) -> None:
        """Make ``sets`` (one session's) the job's baseline, replacing any older one, in one transaction."""
        with self._tx() as db:
            db.execute("DELETE FROM baselines WHERE job=?", (job,))
            db.executemany("INSERT INTO baselines VALUES (?,?,?,?,?,?)",
                           [(job, ps.rank, session, taken_ns, ps.to_bytes(), STORE_SCHEMA_VERSION) for ps in sets])

    def get(self, job: str) -> tuple[str, int, list[PatternSet]] | None:
        """(session, taken_ns, the ranks' pattern sets) of the job's baseline, or None. A row that does
        not read back is left out with a warning (the others still make a baseline)."""
        rows = self._query("SELECT rank, session, taken_ns, body FROM baselines WHERE job=? ORDER BY rank", (job,))
        if not rows:
            return None
        sets = []
        for rank, _, _, body in rows:
            try:
                sets.append(PatternSet.from_bytes(bytes(body)))
            except SchemaError as exc:
                log.warning("baseline of job %s, rank %s: unreadable, left out (%s)", job, rank, exc)
        return (str(rows[0][1]), int(rows[0][2]), sets) if sets else None

    def info(self, job: str | None = None) -> list[BaselineInfo]:
        """Every job's baseline (or ``job``'s), by job."""
        sql = "SELECT job, session, MIN(taken_ns), COUNT(*), SUM(LENGTH(body)) FROM baselines"
        args: tuple[str, ...] = ()
        if job is not None:
            sql += " WHERE job=?"
            args = (job,)
        rows = self._query(sql + " GROUP BY job ORDER BY job", args)
        return [BaselineInfo(str(j), str(s), int(t), int(n), int(b)) for j, s, t, n, b in rows if j is not None]

    def forget(self, job: str) -> int:
        """Drop the job's baseline (the next steady window is taken as the new one). Returns rows deleted."""
        with self._tx() as db:
            return int(db.execute("DELETE FROM baselines WHERE job=?", (job,)).rowcount)
