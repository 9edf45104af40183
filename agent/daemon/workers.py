"""The agent's view of the training processes on its node: one Worker per connected rank.

A Worker is what the agent knows of one rank from its Unix-socket messages (identity, last
heartbeat, iteration statistics); ``liveness`` asks psutil whether its process still runs.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from perftracker.agent.daemon.worker_exits import MemoryCgroup

from perftracker.errors import SchemaError
from perftracker.model.names import NAME_RE
from perftracker.model.trigger import Detection
from perftracker.model.window_length import window_s_error

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
    started: float = 0.0  # its process's creation time (perftracker.agent.daemon.liveness.started_at); 0.0 unknown
    writer: asyncio.StreamWriter | None = None
    iteration: int = -1
    phase: str = ""
    last_event_age_s: float = 0.0
    iteration_ms: float = 0.0
    min_ms: float = 0.0
    phases_ms: list[list[float]] = field(default_factory=list)  # the last steps' phases (ITER_STATS; first look)
    phases_before_ms: list[list[float]] = field(default_factory=list)  # steps from before them
    work_session: str = ""  # the session whose window this agent is still profiling/summarizing/uploading
    last_seen: float = field(default_factory=time.monotonic)
    cgroup: MemoryCgroup | None = None  # its memory cgroup and OOM kill count when last read
    error_file: str = ""  # TORCHELASTIC_ERROR_FILE from its environment
    uid: int = -1  # its uid as the kernel gave it (SO_PEERCRED); -1 not known: no file it names is read
    crash_sent: bool = False  # it sent its own crash snapshot (an uncaught exception)

    @property
    def connected(self) -> bool:
        return self.writer is not None

    def info(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size, "pid": self.pid,
                "tid": self.training_tid, "host": self.host}


def liveness(pid: int, started: float) -> tuple[bool, str]:
    """(alive, state word) of a worker process; (True, "unknown") when it cannot be read."""
    try:
        from perftracker.agent.daemon.liveness import ProcState, probe

        info = probe(pid, started)
        return info.state is not ProcState.DEAD, info.state.value
    except Exception:  # noqa: BLE001 - liveness is best effort
        return True, "unknown"


def select_job(workers: Iterable[Worker], job: str, connected: bool = True) -> list[Worker]:
    """The workers of ``job`` by rank (only the connected ones unless ``connected`` is False)."""
    return sorted((w for w in workers if w.job == job and (w.connected or not connected)), key=lambda w: w.rank)


# ---------------------------------------------------------------- worker messages
# The wire (perftracker.wire.framing) checks that the required fields exist with the right JSON types. The
# agent checks more before it stores or forwards anything: lengths, ranges and the optional fields,
# so that one odd worker can neither crash its connection handler nor make the localizer refuse
# the node's whole heartbeat.
# the one name pattern (perftracker/model/names.py), always a full match: no trailing newline; a
# session id also starts with a letter or digit (the localizer's ids do)
SESSION_RE = re.compile(r"(?=[A-Za-z0-9])" + NAME_RE.pattern)
MAX_PHASE_CHARS = 64
MAX_TEXT_CHARS = 200
MAX_ERROR_CHARS = 2000
MAX_PATH_CHARS = 4096
MAX_RANK = 10_000_000
MAX_RECENT = 10_000


class BadWorkerMessage(ValueError):
    """A worker message the agent will not act on (the message names the field)."""


def _text(msg: dict[str, Any], key: str, limit: int, *, optional: bool = False) -> None:
    v = msg.get(key)
    if v is None and optional:
        return
    if not isinstance(v, str):
        raise BadWorkerMessage(f"{key}: expected a string")
    if len(v) > limit:
        raise BadWorkerMessage(f"{key}: {len(v)} characters, more than {limit}")
    if any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in v):
        raise BadWorkerMessage(f"{key}: control characters or lone surrogates")


def _integer(msg: dict[str, Any], key: str, lo: int, hi: int, *, optional: bool = False) -> None:
    v = msg.get(key)
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadWorkerMessage(f"{key}: expected an integer in [{lo}, {hi}], got {v!r:.40}")


def _number(msg: dict[str, Any], key: str, hi: float = 1e12, *, optional: bool = True) -> None:
    v = msg.get(key)
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= hi:
        raise BadWorkerMessage(f"{key}: expected a finite number in [0, {hi:g}], got {v!r:.40}")


def check_worker_message(msg: dict[str, Any]) -> None:
    """Raise BadWorkerMessage unless a (wire-valid) worker message is within the agent's limits."""
    kind = msg.get("type")
    if kind == "register":
        if not isinstance(msg.get("job"), str) or not NAME_RE.fullmatch(msg["job"]):
            raise BadWorkerMessage(f"job: {str(msg.get('job'))[:80]!r} is not a valid job name")
        _integer(msg, "world_size", 1, MAX_RANK)
        _integer(msg, "rank", 0, msg["world_size"] - 1)
        _integer(msg, "local_rank", -1, 1_000_000)
        _integer(msg, "pid", 1, 2**31 - 1)
        _integer(msg, "training_tid", 0, 2**31 - 1)
        _text(msg, "host", 253)
    elif kind == "heartbeat":
        _integer(msg, "iteration", -1, 2**62)
        _text(msg, "phase", MAX_PHASE_CHARS)
        _number(msg, "idle_s")
    elif kind == "iter_stats":
        _integer(msg, "iteration", -1, 2**62)
        recent = msg.get("recent_ms")
        if not isinstance(recent, list) or len(recent) > MAX_RECENT:
            raise BadWorkerMessage(f"recent_ms: expected a list of at most {MAX_RECENT} numbers")
        for key in ("mean_ms", "min_ms"):
            _number(msg, key)
    elif kind == "trigger":
        _text(msg, "reason", MAX_TEXT_CHARS)
        if msg.get("window_s") is not None and window_s_error(msg["window_s"]):
            raise BadWorkerMessage(f"window_s: {window_s_error(msg['window_s'])}")
        if msg.get("detection") is not None:  # a worker of before issue 48 sends none
            try:
                Detection.from_dict(msg["detection"], "detection")
            except SchemaError as exc:
                raise BadWorkerMessage(str(exc)) from None
    elif kind == "window_done":
        session = msg.get("session")
        if not isinstance(session, str) or not SESSION_RE.fullmatch(session):
            raise BadWorkerMessage(f"session: {str(session)[:80]!r} is not a valid session id")
        _text(msg, "raw_path", MAX_PATH_CHARS)
        _text(msg, "samples_path", MAX_PATH_CHARS, optional=True)
        _text(msg, "error", MAX_ERROR_CHARS)
        _integer(msg, "start_ns", 0, 2**63 - 1)
        _integer(msg, "end_ns", 0, 2**63 - 1)
    elif kind in ("job_serve", "job_route"):  # issue 42: one localizer per job across nodes
        check_job_link(msg)


def check_job_link(msg: dict[str, Any]) -> None:
    """JOB_SERVE / JOB_ROUTE within bounds: a job name, a literal IP address to bind, a port, a job
    token of 16 to 200 characters, an http(s) URL of at most 300."""
    if not NAME_RE.fullmatch(str(msg.get("job"))):
        raise BadWorkerMessage(f"job: {str(msg.get('job'))[:80]!r} is not a valid job name")
    token = msg.get("token")
    if not isinstance(token, str) or not 16 <= len(token) <= 200 or not token.isascii() or not token.isprintable():
        raise BadWorkerMessage("token: expected 16 to 200 printable ASCII characters")
    if msg["type"] == "job_serve":
        try:
            ipaddress.ip_address(str(msg.get("host")))
        except ValueError:
            raise BadWorkerMessage(f"host: {str(msg.get('host'))[:80]!r} is not an IP address") from None
        _integer(msg, "port", 0, 65535)
    else:
        url = msg.get("url")
        if not isinstance(url, str) or len(url) > 300 or not url.startswith(("http://", "https://")):
            raise BadWorkerMessage(f"url: {str(url)[:80]!r} is not an http(s) URL of at most 300 characters")
        _text(msg, "served_by", 253)


MAX_PHASE_ROWS = 64


def phase_rows(value: Any) -> list[list[float]]:
    """ITER_STATS' phase rows (steps × [data, step, rest] ms), checked: anything else is [] (the first
    look then has no times for this rank and leaves the slowdown to the window)."""
    if not isinstance(value, list) or len(value) > MAX_PHASE_ROWS:
        return []
    out = []
    for row in value:
        if (not isinstance(row, list) or len(row) != 3
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                           for x in row)):
            return []
        out.append([float(x) for x in row])
    return out
