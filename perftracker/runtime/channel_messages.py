"""The messages a worker sends its node agent, built from the runtime's state (perftracker.wire.framing frames).

Pure builders: they read the runtime (identity, iteration, recent iteration times, last hook
event) and return ``wire.make_message`` dicts. The channel (perftracker.runtime.channel) queues and sends
them; nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from perftracker.model import HangSnapshot
from perftracker.model.trigger import Detection
from perftracker.runtime.protocols import ChannelRuntime, FinishedWindow, WorkerState
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType


def identity_fields(runtime: WorkerState) -> dict[str, Any]:
    """The worker's identity as REGISTER carries it."""
    ident = runtime.identity
    return {
        "job": str(ident.job),
        "rank": int(ident.rank),
        "world_size": int(ident.world_size),
        "local_rank": int(ident.local_rank),
        "pid": int(ident.pid),
        "training_tid": int(ident.training_tid),
        "host": str(ident.host),
    }


def current_phase() -> str:
    """The detector's phase, as ``perftracker.status()`` says it (this process's runtime, else the
    last one, else "inactive"); "" when it cannot tell. Read from the runtime module, not the
    package: the package's import starts the channel that imports this module."""
    try:
        from perftracker.runtime.runtime import get_runtime, last_runtime

        rt = get_runtime() or last_runtime()
        return "inactive" if rt is None else str(rt.status().get("phase", ""))
    except Exception:  # status() is best-effort here
        return ""


def json_safe(detail: Mapping[str, object]) -> dict[str, Any]:
    """A trigger's detail with every value JSON-encodable (non-finite floats become None)."""
    out: dict[str, Any] = {}
    for k, v in dict(detail).items():
        if isinstance(v, (str, int, bool)) or v is None:
            out[str(k)] = v
        elif isinstance(v, float):
            out[str(k)] = v if v == v and abs(v) != float("inf") else None
        elif isinstance(v, (list, tuple)):
            out[str(k)] = [x if isinstance(x, (str, int, float, bool)) else str(x) for x in v][:1000]
        else:
            out[str(k)] = str(v)
    return out


def register_message(runtime: WorkerState, job_link_pending: bool = False) -> dict[str, Any]:
    """REGISTER; ``job_link_pending``: the job spans nodes and its ranks will name its one localizer
    (perftracker/runtime/job_link.py), so the agent registers it nowhere until then."""
    extra: dict[str, Any] = {"job_link": "pending"} if job_link_pending else {}
    return wire.make_message(MessageType.REGISTER, protocol=wire.PROTOCOL_VERSION, **identity_fields(runtime),
                             **extra)


def trigger_message(reason: str, detail: Mapping[str, object], window_s: float | None = None) -> dict[str, Any]:
    """TRIGGER: the reason, the runtime's detail, and the typed detection read from it once, here
    (perftracker/model/trigger.py, versioned); ``window_s`` only when the user set the window
    length explicitly."""
    extra: dict[str, Any] = {} if window_s is None else {"window_s": float(window_s)}
    rank = detail.get("rank")
    detection = Detection.from_detail(rank if isinstance(rank, int) and not isinstance(rank, bool) else 0,
                                      str(reason), detail)
    return wire.make_message(MessageType.TRIGGER, reason=str(reason), detail=json_safe(detail),
                             detection=detection.to_dict(), **extra)


def blocked_message(detail: Mapping[str, object]) -> dict[str, Any]:
    return wire.make_message(MessageType.BLOCKED, detail=json_safe(detail))


def heartbeat_message(runtime: ChannelRuntime) -> dict[str, Any]:
    """HEARTBEAT: iteration, phase, and the time since the last hook event (``idle_s``)."""
    last = None
    try:
        last = runtime.last_event()
    except Exception:  # noqa: BLE001 - best effort
        pass
    fields: dict[str, Any] = {"iteration": int(runtime.iteration or 0), "phase": current_phase(),
                              "t_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}
    if last:
        fields["last_event"] = str(last[0])
        fields["idle_s"] = max(0.0, (time.monotonic_ns() - int(last[1])) / 1e9)
    return wire.make_message(MessageType.HEARTBEAT, **fields)


def iter_stats_message(runtime: ChannelRuntime, recent_iterations: int) -> dict[str, Any] | None:
    """ITER_STATS over the last ``recent_iterations`` iteration times; None when there are none."""
    try:
        recent = [float(x) for x in list(runtime.recent_iteration_ms())[-recent_iterations:]]
    except Exception:  # noqa: BLE001
        return None
    recent = [x for x in recent if x == x and x >= 0 and x != float("inf")]
    if not recent:
        return None
    return wire.make_message(
        MessageType.ITER_STATS, iteration=int(runtime.iteration or 0), recent_ms=recent,
        mean_ms=sum(recent) / len(recent), min_ms=min(recent), phase=current_phase(), **phase_fields(runtime),
    )


PHASE_ROWS = 20  # steps of phase times sent now, and from before (the first look, issue 30)


def phase_fields(runtime: Any) -> dict[str, Any]:
    """The hooks' per-step phase times (perftracker/runtime/phase_times.py) for the first look: the
    last ``PHASE_ROWS`` steps, and, once the ring holds six times as many, its oldest ``PHASE_ROWS``
    (before a slowdown that the detector saw); {} when there are none or they cannot be read."""
    try:
        rows = runtime.phases.recent_ms()
    except Exception:  # noqa: BLE001 - no phases (an older runtime), never into training
        return {}
    if len(rows) < PHASE_ROWS:
        return {}
    out = {"phases_ms": [[round(float(x), 3) for x in r] for r in rows[-PHASE_ROWS:]]}
    if len(rows) >= 6 * PHASE_ROWS:
        out["phases_before_ms"] = [[round(float(x), 3) for x in r] for r in rows[:PHASE_ROWS]]
    return out


def window_done_message(result: FinishedWindow, session: str, cost: Mapping[str, float] | None = None
                        ) -> dict[str, Any]:
    """WINDOW_DONE from a ProfileWindow's WindowResult (``session`` when it names none); ``cost``:
    what the window cost and the budget (window_cost.report_fields), for the report's header."""
    extra = {"cost": dict(cost)} if cost else {}
    return wire.make_message(
        MessageType.WINDOW_DONE, session=str(result.session or session), raw_path=str(result.raw_path or ""),
        start_ns=int(result.start_ns or 0), end_ns=int(result.end_ns or 0), error=str(result.error or ""),
        samples_path=str(result.samples_path or ""),
        # a child that outlives the worker writes raw_path (at exit, issue 30): the agent waits for it
        writer_pid=int(getattr(result, "writer_pid", 0) or 0), **extra,
    )


def window_failed_message(session: str, error: str) -> dict[str, Any]:
    """WINDOW_DONE for a window that could not start."""
    return wire.make_message(MessageType.WINDOW_DONE, session=session, raw_path="", start_ns=0, end_ns=0,
                             error=error)


def snapshot_message(snapshot: HangSnapshot) -> dict[str, Any]:
    """HANG_SNAPSHOT carrying a HangSnapshot."""
    return wire.make_message(MessageType.HANG_SNAPSHOT, snapshot=snapshot.to_dict())
