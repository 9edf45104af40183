"""The agent's view of the training processes on its node: one Worker per connected rank.

A Worker is what the agent knows of one rank from its Unix-socket messages (identity, last
heartbeat, iteration statistics); ``liveness`` asks procfs whether its process still runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

SILENT_AFTER_S = 3.0  # a connected worker sends a heartbeat every second; past this it is silent
FOLLOW_S = 2.0  # a worker dying this soon after another of its job died was stopped because of it


@dataclass
class Worker:
    job: str
    rank: int
    world_size: int
    local_rank: int
    pid: int
    training_tid: int
    host: str
    start_ticks: int = 0
    writer: asyncio.StreamWriter | None = None
    iteration: int = -1
    phase: str = ""
    last_event_age_s: float = 0.0
    iteration_ms: float = 0.0
    min_ms: float = 0.0
    work_session: str = ""  # the session whose window this agent is still profiling/summarizing/uploading
    last_seen: float = field(default_factory=time.monotonic)

    @property
    def connected(self) -> bool:
        return self.writer is not None

    def info(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size, "pid": self.pid,
                "tid": self.training_tid, "host": self.host}


def liveness(pid: int, start_ticks: int) -> tuple[bool, str]:
    """(alive, procfs state word) of a worker process; (True, "unknown") when procfs cannot tell."""
    try:
        from agent.liveness import ProcState, probe

        info = probe(pid, start_ticks)
        return info.state is not ProcState.DEAD, info.state.value
    except Exception:  # noqa: BLE001 - liveness is best effort
        return True, "unknown"


def select_job(workers: Iterable[Worker], job: str, connected: bool = True) -> list[Worker]:
    """The workers of ``job`` by rank (only the connected ones unless ``connected`` is False)."""
    return sorted((w for w in workers if w.job == job and (w.connected or not connected)), key=lambda w: w.rank)
