"""Request schemas of the localizer's HTTP API and their validation.

Each ``parse_*`` function takes a decoded JSON value and returns a frozen dataclass, or raises
``RequestError`` with a message that names the offending field. The service turns a RequestError
into a 4xx JSON answer ``{"error": message}``; nothing here trusts the network.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perftracker.errors import ConfigError, SchemaError
from perftracker.model.names import MAX_NAME_CHARS, NAME_CHARS, is_name
from perftracker.model.names import NAME_RE as _NAME_RE  # noqa: F401 - the one pattern (full match)
from perftracker.model.trigger import Detection
from perftracker.model.window_length import window_s_error

MAX_WORKERS_PER_AGENT = 4096


class RequestError(SchemaError):
    """A request body or parameter is invalid. ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    local_rank: int
    world_size: int
    pid: int
    tid: int
    host: str


@dataclass(frozen=True)
class Registration:
    job: str
    agent_id: str
    host: str
    workers: tuple[WorkerInfo, ...]


@dataclass(frozen=True)
class RankBeat:
    rank: int
    iteration: int
    phase: str
    last_event_age_s: float
    alive: bool
    iteration_ms: float
    working_on: str = ""  # a session whose window the agent is still working on for this rank
    # the hooks' per-step phase times, steps × (data, step, rest) ms, now and from before (first look)
    phases_ms: tuple[tuple[float, float, float], ...] = ()
    phases_before_ms: tuple[tuple[float, float, float], ...] = ()


@dataclass(frozen=True)
class Heartbeat:
    job: str
    agent_id: str
    ranks: tuple[RankBeat, ...]


@dataclass(frozen=True)
class TriggerRequest:
    reason: str
    window_s: float | None  # None: the service default
    detection: Detection | None = None  # a worker's typed detection (perftracker/model/trigger.py)


def _obj(d: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise RequestError(f"{where}: expected a JSON object, got {type(d).__name__}")
    return d


def _str(d: Mapping[str, Any], key: str, where: str, *, name: bool = False, default: str | None = None) -> str:
    if key not in d or d[key] is None:
        if default is not None:
            return default
        raise RequestError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, str):
        raise RequestError(f"{where}.{key}: expected a string, got {type(v).__name__}")
    if name:
        if not is_name(v):
            raise RequestError(f"{where}.{key}: {v[:80]!r} is not a valid name "
                               f"(1-{MAX_NAME_CHARS} characters of {NAME_CHARS}, not . or ..)")
    elif len(v) > 4 * MAX_NAME_CHARS:
        raise RequestError(f"{where}.{key}: longer than {4 * MAX_NAME_CHARS} characters")
    return v


def _int(d: Mapping[str, Any], key: str, where: str, *, lo: int = 0, hi: int = 2**62,
         default: int | None = None) -> int:
    if key not in d or d[key] is None:
        if default is not None:
            return default
        raise RequestError(f"{where}: missing field {key!r}")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"{where}.{key}: expected an integer, got {v!r:.40}")
    if not lo <= v <= hi:
        raise RequestError(f"{where}.{key}: {v} outside [{lo}, {hi}]")
    return v


def _float(d: Mapping[str, Any], key: str, where: str, *, lo: float = 0.0, hi: float = 1e12,
           default: float | None = None) -> float:
    if key not in d or d[key] is None:
        if default is not None:
            return default
        raise RequestError(f"{where}: missing field {key!r}")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RequestError(f"{where}.{key}: expected a finite number, got {v!r:.40}")
    if not lo <= v <= hi:
        raise RequestError(f"{where}.{key}: {v} outside [{lo}, {hi}]")
    return float(v)


def _list(d: Mapping[str, Any], key: str, where: str, max_len: int) -> list[Any]:
    v = d.get(key)
    if not isinstance(v, list):
        raise RequestError(f"{where}.{key}: expected a list")
    if len(v) > max_len:
        raise RequestError(f"{where}.{key}: more than {max_len} entries", status=413)
    return v


def parse_registration(body: Any) -> Registration:
    where = "register"
    d = _obj(body, where)
    job = _str(d, "job", where, name=True)
    workers = []
    seen: set[int] = set()
    for i, w in enumerate(_list(d, "workers", where, MAX_WORKERS_PER_AGENT)):
        ww = f"{where}.workers[{i}]"
        w = _obj(w, ww)
        world = _int(w, "world_size", ww, lo=1, hi=10_000_000)
        rank = _int(w, "rank", ww, hi=world - 1)
        if rank in seen:
            raise RequestError(f"{ww}.rank: rank {rank} listed twice")
        seen.add(rank)
        workers.append(WorkerInfo(rank=rank, local_rank=_int(w, "local_rank", ww, lo=-1, hi=1_000_000, default=-1),
                                  world_size=world, pid=_int(w, "pid", ww, default=0),
                                  tid=_int(w, "tid", ww, default=0), host=_str(w, "host", ww, default="")))
    return Registration(job=job, agent_id=_str(d, "agent_id", where, name=True),
                        host=_str(d, "host", where, default=""), workers=tuple(workers))


def parse_heartbeat(body: Any) -> Heartbeat:
    where = "heartbeat"
    d = _obj(body, where)
    beats = []
    for i, r in enumerate(_list(d, "ranks", where, MAX_WORKERS_PER_AGENT)):
        rw = f"{where}.ranks[{i}]"
        r = _obj(r, rw)
        alive = r.get("alive", True)
        if not isinstance(alive, bool):
            raise RequestError(f"{rw}.alive: expected true or false")
        beats.append(RankBeat(rank=_int(r, "rank", rw, hi=10_000_000), iteration=_int(r, "iteration", rw, lo=-1, default=-1),
                              phase=_str(r, "phase", rw, default=""),
                              last_event_age_s=_float(r, "last_event_age_s", rw, default=0.0),
                              alive=alive, iteration_ms=_float(r, "iteration_ms", rw, default=0.0),
                              working_on=_str(r, "working_on", rw, default=""),
                              phases_ms=_phase_rows(r, "phases_ms", rw),
                              phases_before_ms=_phase_rows(r, "phases_before_ms", rw)))
    return Heartbeat(job=_str(d, "job", where, name=True), agent_id=_str(d, "agent_id", where, name=True),
                     ranks=tuple(beats))


MAX_PHASE_ROWS = 64


def _phase_rows(d: Mapping[str, Any], key: str, where: str) -> tuple[tuple[float, float, float], ...]:
    """An optional list of [data, step, rest] ms rows (the first look's input)."""
    if key not in d:
        return ()
    rows = d[key]
    if not isinstance(rows, list) or len(rows) > MAX_PHASE_ROWS:
        raise RequestError(f"{where}.{key}: expected a list of at most {MAX_PHASE_ROWS} rows")
    out = []
    for i, row in enumerate(rows):
        if (not isinstance(row, list) or len(row) != 3
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                           for x in row)):
            raise RequestError(f"{where}.{key}[{i}]: expected [data_ms, step_ms, rest_ms], finite, >= 0")
        out.append((float(row[0]), float(row[1]), float(row[2])))
    return tuple(out)


def parse_trigger(body: Any) -> TriggerRequest:
    where = "trigger"
    d = _obj(body, where)
    window = None
    if d.get("window_s") is not None:
        if window_s_error(d["window_s"]):
            raise RequestError(f"{where}.window_s: {window_s_error(d['window_s'])}")
        window = float(d["window_s"])
    detection = None
    if d.get("detection") is not None:
        try:
            detection = Detection.from_dict(_obj(d["detection"], f"{where}.detection"), f"{where}.detection")
        except SchemaError as exc:
            raise RequestError(str(exc)) from None
    return TriggerRequest(reason=_str(d, "reason", where, default="on-demand"), window_s=window,
                          detection=detection)


def parse_name(value: str, what: str) -> str:
    """A job or session name from the URL or query string."""
    return _str({what: value}, what, "request", name=True)


def parse_int_param(value: str | None, what: str, lo: int, hi: int, default: int) -> int:
    """An integer query parameter in [lo, hi] (``default`` when absent)."""
    if value is None or value == "":
        return default
    if not value.isdigit() or len(value) > 19:
        raise RequestError(f"{what}: {value[:40]!r} is not a non-negative integer")
    v = int(value)
    if not lo <= v <= hi:
        raise RequestError(f"{what}: {v} outside [{lo}, {hi}]")
    return v


def parse_timeout(value: str | None, max_s: float) -> float:
    if value is None or value == "":
        return max_s
    try:
        t = float(value)
    except ValueError:
        raise RequestError(f"timeout_s: {value[:40]!r} is not a number") from None
    if not math.isfinite(t) or t < 0:
        raise RequestError(f"timeout_s: {value[:40]!r} must be a finite number >= 0")
    return min(t, max_s)


def validate_expect_file(path: str | Path) -> dict[str, str]:
    """Check an expected-ranges file (``--expect FILE``) before the localizer starts.

    Localization picks the "gpu" or the "cpu" profile by what the workers saw, so both must resolve
    (a file with a single profile serves both). Every profile in the file is parsed, so that a typo
    is reported now, not when a session localizes. Returns {"gpu": profile, "cpu": profile}.
    Raises ConfigError naming the file, the profile and the field."""
    import tomllib

    from perftracker.localizer.diagnose.method.expect import (
        BUILTIN_PROFILES,
        load_expectations,
        parse_expectations,
    )

    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--expect {path}: is a directory, not an expected-ranges TOML file")
    used = {p: load_expectations(path, p).profile for p in BUILTIN_PROFILES}  # missing file, bad TOML, ...
    with open(path, "rb") as fh:
        doc = tomllib.load(fh)
    for name in doc.get("profiles", {}):
        parse_expectations(doc, name, str(path))
    return used
