"""The localizer store's row types: registered workers, sessions and heartbeats (pure data)."""

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
