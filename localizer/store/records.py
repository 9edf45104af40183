"""The localizer store's row types (registered workers, sessions and heartbeats) and its tables' DDL
(pure data; the pattern tables' DDL is in perftracker.localizer.store.pattern_store)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perftracker.localizer.store.rank_ranges import RankRanges

from perftracker.model.trigger import Detection

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
    # kept as ranges (``RankRanges``): memory O(ranges), whatever world size a registration claims;
    # a tuple or list given here is converted
    expected: RankRanges = field(default_factory=RankRanges)
    joins: int = 0
    error: str = ""
    uploaded: tuple[int, ...] = field(default=())
    # the worker's typed detection that opened the session (perftracker/model/trigger.py); None for
    # a manual trigger, a hang or a crash
    detection: Detection | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.expected, RankRanges):
            object.__setattr__(self, "expected", RankRanges.of(self.expected))

    @property
    def expected_set(self) -> RankRanges:
        """``expected`` (``in`` is a bisection of its ranges)."""
        return self.expected

    @property
    def missing_ranges(self) -> RankRanges:
        """Expected ranks without an upload, as ranges: O(ranges + uploads)."""
        return self.expected.without(self.uploaded)

    @property
    def missing(self) -> tuple[int, ...]:
        return tuple(self.missing_ranges)

    def summary_dict(self, max_ranges: int = 16, missing: RankRanges | None = None) -> dict[str, Any]:
        """The session without its rank lists: counts, and at most ``max_ranges`` ranges of the
        missing ranks (``missing_ranges``, [lo, hi) pairs; ``missing_more`` when there are more).
        Its size does not grow with the world size (a page of ``GET /v1/sessions``)."""
        missing = self.missing_ranges if missing is None else missing
        pairs = missing.to_json()
        return {
            "schema_version": STORE_SCHEMA_VERSION, "session": self.session, "job": self.job,
            "kind": self.kind, "reason": self.reason, "window_s": self.window_s, "state": self.state,
            "opened_ns": self.opened_ns, "deadline_ns": self.deadline_ns, "closed_ns": self.closed_ns,
            "n_expected": len(self.expected), "n_uploaded": len(self.uploaded), "n_missing": len(missing),
            "missing_ranges": pairs[:max_ranges], "missing_more": len(pairs) > max_ranges,
            "joins": self.joins, "error": self.error,
            **({"detection": self.detection.to_dict()} if self.detection is not None else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        """The whole session, its rank lists included (O(expected ranks): build it off the event loop)."""
        missing = self.missing_ranges
        d = self.summary_dict(missing=missing)
        d.update({"expected": list(self.expected), "uploaded": list(self.uploaded), "missing": list(missing),
                  "expected_ranges": self.expected.to_json(), "missing_ranges": missing.to_json(),
                  "missing_more": False})
        return d


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
                 "closed_ns, expected, joins, error, detection")

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
    schema_version INTEGER NOT NULL, detection TEXT NOT NULL DEFAULT '');
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
