"""The localizer store's row types (registered workers, sessions and heartbeats) and its tables' DDL
(pure data; the pattern tables' DDL is in perftracker.localizer.store.pattern_store)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

STORE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class WorkerRecord:
    """One registered worker."""

    job: str
    rank: int
    agent_id: str
    local_rank: int
    world_size: int
    pid: int
    tid: int
    host: str

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
                "pid": self.pid, "tid": self.tid, "host": self.host, "agent_id": self.agent_id}


@dataclass(frozen=True)
class SessionRecord:
    """One session row. Times are wall-clock ns (they survive a restart)."""

    seq: int
    session: str
    job: str
    kind: str  # "slowdown" | "hang"
    reason: str
    window_s: float
    state: str  # "open" | "localizing" | "done" | "failed"
    opened_ns: int
    deadline_ns: int
    closed_ns: int = 0
    expected: tuple[int, ...] = ()
    joins: int = 0
    error: str = ""
    uploaded: tuple[int, ...] = field(default=())

    @cached_property
    def expected_set(self) -> frozenset[int]:
        """``expected`` as a set (computed once per record: the store keeps records of open sessions)."""
        return frozenset(self.expected)

    @property
    def missing(self) -> tuple[int, ...]:
        got = set(self.uploaded)
        return tuple(r for r in self.expected if r not in got)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": STORE_SCHEMA_VERSION, "session": self.session, "job": self.job,
            "kind": self.kind, "reason": self.reason, "window_s": self.window_s, "state": self.state,
            "opened_ns": self.opened_ns, "deadline_ns": self.deadline_ns, "closed_ns": self.closed_ns,
            "expected": list(self.expected), "uploaded": list(self.uploaded),
            "missing": list(self.missing), "joins": self.joins, "error": self.error,
        }


@dataclass(frozen=True)
class HeartbeatRecord:
    job: str
    rank: int
    agent_id: str
    iteration: int
    phase: str
    last_event_age_s: float
    alive: bool
    iteration_ms: float
    received_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "agent_id": self.agent_id, "iteration": self.iteration,
                "phase": self.phase, "last_event_age_s": self.last_event_age_s, "alive": self.alive,
                "iteration_ms": self.iteration_ms, "received_ns": self.received_ns}


SESSION_COLUMNS = ("seq, session, job, kind, reason, window_s, state, opened_ns, deadline_ns, "
                 "closed_ns, expected, joins, error")

# the registration, session and event tables (perftracker.localizer.store.sqlite_store, event_store)
STORE_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS agents (
    job TEXT NOT NULL, agent_id TEXT NOT NULL, host TEXT NOT NULL,
    registered_ns INTEGER NOT NULL, last_seen_ns INTEGER NOT NULL,
    schema_version INTEGER NOT NULL, key_hash TEXT NOT NULL DEFAULT '', PRIMARY KEY (job, agent_id));
CREATE TABLE IF NOT EXISTS workers (
    job TEXT NOT NULL, rank INTEGER NOT NULL, agent_id TEXT NOT NULL, local_rank INTEGER NOT NULL,
    world_size INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, host TEXT NOT NULL,
    registered_ns INTEGER NOT NULL, schema_version INTEGER NOT NULL, PRIMARY KEY (job, rank));
CREATE TABLE IF NOT EXISTS sessions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL UNIQUE, job TEXT NOT NULL,
    kind TEXT NOT NULL, reason TEXT NOT NULL, window_s REAL NOT NULL, state TEXT NOT NULL,
    opened_ns INTEGER NOT NULL, deadline_ns INTEGER NOT NULL, closed_ns INTEGER NOT NULL DEFAULT 0,
    expected TEXT NOT NULL, joins INTEGER NOT NULL DEFAULT 0, error TEXT NOT NULL DEFAULT '',
    schema_version INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS sessions_job ON sessions (job, state);
CREATE TABLE IF NOT EXISTS hang_snapshots (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, session TEXT NOT NULL,
    rank INTEGER NOT NULL, taken_ns INTEGER NOT NULL, body TEXT NOT NULL,
    received_ns INTEGER NOT NULL, schema_version INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS hang_session ON hang_snapshots (session, rank);
CREATE TABLE IF NOT EXISTS heartbeats (
    job TEXT NOT NULL, rank INTEGER NOT NULL, agent_id TEXT NOT NULL, iteration INTEGER NOT NULL,
    phase TEXT NOT NULL, last_event_age_s REAL NOT NULL, alive INTEGER NOT NULL,
    iteration_ms REAL NOT NULL, received_ns INTEGER NOT NULL, schema_version INTEGER NOT NULL,
    PRIMARY KEY (job, rank));
CREATE TABLE IF NOT EXISTS reports (
    session TEXT PRIMARY KEY, job TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
    created_ns INTEGER NOT NULL, body TEXT NOT NULL, schema_version INTEGER NOT NULL);
"""
