"""The job's process groups and each collective's group, seen live from the training process (issue 28).

Offline, a Kineto trace names the job's process groups (``distributedInfo.pg_config``) and, on
NCCL, each collective's group. A live window has neither: torch's raw profiler events carry no
group, and a gloo job's events name none at all. So for each window the runtime records

- **the process groups**, as ``torch.distributed`` describes them (``_get_all_pg_configs``, the
  same records torch.profiler writes into ``pg_config``; else ``_world.pg_names`` with
  ``get_process_group_ranks`` and the group's ``group_desc``): ``(name, description, global
  ranks)``, the form of ``WindowMeta.process_groups``. Only the groups this rank belongs to, as
  in a trace.
- **which collective ran in which group**: while the window is open, the public collective and
  point-to-point functions of ``torch.distributed`` (``all_reduce``, ``send``, ``recv``,
  ``batch_isend_irecv`` ...; not ``isend``/``irecv``, see ``_FUNCS``) are wrapped. Each call is recorded as a ``Call`` (its kind, group
  name, peer's global rank, start and end on CLOCK_MONOTONIC) and then runs unchanged; the
  wrappers are removed when the window ends (an attribute someone else replaced meanwhile is left
  alone). ``perftracker.runtime.comm_rows`` turns the calls into ``WindowMeta.comm`` rows.

What this cannot see: collectives issued from C++ (DDP's reducer, functional collectives of
compiled code) and calls through a reference taken before the window (``from torch.distributed
import all_reduce``); their events get no group (the localizer then infers, as for a trace without
groups). ``PERFTRACKER_RECORD_COLLECTIVES=0`` turns the wrapping off (the groups are still read):
code compiled with torch.compile that calls these functions may be recompiled when they change.

Never into the training job: every failure here is logged once and swallowed; a wrapper records
only after the user's call returned, and re-raises the user's own exceptions untouched.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perftracker.warnonce import WarnOnce

log = logging.getLogger(__name__)
_warn = WarnOnce(log)

RECORD_ENV = "PERFTRACKER_RECORD_COLLECTIVES"
MAX_CALLS = 200_000  # calls kept per window (the earliest)
_KEEP_SESSIONS = 4  # the latest windows' records kept for their writers

# wrapped function -> (its peer parameter's name or "", the peer's direction: "dst" the peer
# receives, "src" it sends); a peer is kept for point-to-point calls only (_P2P)
_FUNCS: dict[str, tuple[str, str]] = {
    "all_reduce": ("", ""), "all_gather": ("", ""), "all_gather_into_tensor": ("", ""),
    "reduce_scatter": ("", ""), "reduce_scatter_tensor": ("", ""), "all_to_all": ("", ""),
    "all_to_all_single": ("", ""), "broadcast": ("src", "src"), "reduce": ("dst", "dst"),
    "gather": ("dst", "dst"), "scatter": ("src", "src"), "barrier": ("", ""),
    "send": ("dst", "dst"), "recv": ("src", "src"),
}
# isend/irecv are never wrapped: torch.distributed.P2POp(op, ...) accepts only the original
# functions (distributed_c10d._check_op compares by identity), and torch.distributed.pipelining
# builds P2POp(dist.irecv, ...) from the module attribute: a wrapper there raised ValueError in every
# stage of a pipeline job when a window opened (issue 31). Their batched form is recorded through
# batch_isend_irecv.


@dataclass(frozen=True)
class Call:
    """One collective or point-to-point call of the training process."""

    kind: str  # canonical collective kind (``perftracker.runtime.comm_rows.collective_kind``)
    group: str  # the process group's name ("0" the default group)
    src: int  # global rank that sends (point-to-point), else -1
    dst: int  # global rank that receives (point-to-point), else -1
    start_ns: int  # CLOCK_MONOTONIC
    end_ns: int
    thread: int  # native thread id of the caller (a RawWindow's tid)


def _dist() -> Any:
    """torch.distributed when it is initialized in this process, else None."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception as exc:  # noqa: BLE001
        _warn("dist", "perftracker: torch.distributed not readable (%s: %s)", type(exc).__name__, exc)
    return None


def process_groups() -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """This rank's process groups (name, description, global ranks), as ``torch.distributed``
    describes them; () when it is not initialized or cannot be read (logged once)."""
    dist = _dist()
    if dist is None:
        return ()
    c10d = dist.distributed_c10d
    try:
        configs = getattr(c10d, "_get_all_pg_configs", None)
        if configs is not None:
            out = []
            for g in configs():
                ranks = tuple(int(r) for r in g.get("ranks", ()))
                out.append((str(g.get("pg_name", ""))[:200], str(g.get("pg_desc", "") or "")[:200], ranks))
            return tuple(out)
        out = []
        for pg, name in list(c10d._world.pg_names.items()):
            ranks = tuple(int(r) for r in dist.get_process_group_ranks(pg))
            out.append((str(name)[:200], str(getattr(pg, "group_desc", "") or "")[:200], ranks))
        return tuple(out)
    except Exception as exc:  # noqa: BLE001
        _warn("groups", "perftracker: process groups not readable (%s: %s); the report infers them",
              type(exc).__name__, exc)
        return ()


def _group_name(dist: Any, group: Any) -> str:
    pg = group if group is not None else dist.group.WORLD
    c10d = dist.distributed_c10d
    name = c10d._world.pg_names.get(pg)
    return str(name if name is not None else getattr(pg, "group_name", ""))


def _global_peer(dist: Any, peer: Any, group: Any, group_peer: Any) -> int:
    if isinstance(peer, int) and not isinstance(peer, bool):
        return peer
    if isinstance(group_peer, int) and group is not None:
        return int(dist.get_global_rank(group, group_peer))
    return -1


class CollectiveRecorder:
    """Wraps ``torch.distributed``'s collective functions for one window (``install``/``remove``,
    on any thread; the wrappers record from every thread that calls them)."""

    def __init__(self, now_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.calls: list[Call] = []
        self._now = now_ns
        self._orig: dict[str, Any] = {}
        self._wrappers: dict[str, Any] = {}
        self._dist: Any = None
        self._rank = -1

    def install(self) -> bool:
        """True when the functions are wrapped; False (nothing changed) when torch.distributed is
        not initialized, recording is turned off, or wrapping failed (logged once)."""
        if os.environ.get(RECORD_ENV, "1").strip() in ("0", "false", "no", "off"):
            return False
        dist = _dist()
        if dist is None:
            return False
        try:
            self._dist, self._rank = dist, int(dist.get_rank())
            for name, (peer_param, direction) in _FUNCS.items():
                fn = getattr(dist, name, None)
                if fn is None or getattr(fn, "_perftracker_wrapped", False):
                    continue
                wrapper = self._wrap(fn, name, peer_param, direction)
                self._orig[name] = fn
                self._wrappers[name] = wrapper
                setattr(dist, name, wrapper)
            batch = getattr(dist, "batch_isend_irecv", None)
            if batch is not None and not getattr(batch, "_perftracker_wrapped", False):
                self._orig["batch_isend_irecv"] = batch
                self._wrappers["batch_isend_irecv"] = self._wrap_batch(batch)
                dist.batch_isend_irecv = self._wrappers["batch_isend_irecv"]
        except Exception as exc:  # noqa: BLE001
            _warn("wrap", "perftracker: cannot record collectives' groups (%s: %s)", type(exc).__name__, exc)
            self.remove()
            return False
        return True

    def remove(self) -> None:
        """Put the original functions back (where a wrapper of ours is still in place)."""
        dist = self._dist
        for name, fn in self._orig.items():
            try:
                if getattr(dist, name, None) is self._wrappers.get(name):
                    setattr(dist, name, fn)
            except Exception as exc:  # noqa: BLE001
                _warn("unwrap", "perftracker: cannot restore torch.distributed.%s (%s)", name, exc)
        self._orig.clear()
        self._wrappers.clear()

    # ------------------------------------------------------------------ the wrappers
    def _record(self, kind: str, group: Any, peer: int, direction: str, t0: int) -> None:
        try:
            if len(self.calls) >= MAX_CALLS:
                return
            dist = self._dist
            src = peer if direction == "src" else (self._rank if direction == "dst" and peer >= 0 else -1)
            dst = peer if direction == "dst" else (self._rank if direction == "src" and peer >= 0 else -1)
            if peer < 0:
                src = dst = -1
            from perftracker.runtime.comm_rows import collective_kind

            self.calls.append(Call(collective_kind(kind), _group_name(dist, group), src, dst, t0, self._now(),
                                   threading.get_native_id()))
        except Exception as exc:  # noqa: BLE001
            _warn("record", "perftracker: a collective's group not recorded (%s: %s)", type(exc).__name__, exc)

    def _wrap(self, fn: Any, name: str, peer_param: str, direction: str) -> Any:
        import inspect

        params = list(inspect.signature(fn).parameters)
        g_at = params.index("group") if "group" in params else -1
        p_at = params.index(peer_param) if peer_param in params else -1
        gp_name = f"group_{peer_param}" if peer_param else ""
        recorder = self

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = recorder._now()
            out = fn(*args, **kwargs)
            try:
                group = kwargs.get("group", args[g_at] if 0 <= g_at < len(args) else None)
                peer = kwargs.get(peer_param, args[p_at] if 0 <= p_at < len(args) else None) if peer_param else None
                rank = _global_peer(recorder._dist, peer, group, kwargs.get(gp_name)) if peer_param else -1
                recorder._record(name, group, rank if direction in ("src", "dst") and name in _P2P else -1,
                                 direction, t0)
            except Exception as exc:  # noqa: BLE001
                _warn("record", "perftracker: a collective's group not recorded (%s: %s)", type(exc).__name__, exc)
            return out

        wrapper._perftracker_wrapped = True  # type: ignore[attr-defined]
        return wrapper

    def _wrap_batch(self, fn: Any) -> Any:
        recorder = self

        @functools.wraps(fn)
        def wrapper(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = recorder._now()
            out = fn(p2p_op_list, *args, **kwargs)
            try:
                for op in list(p2p_op_list):
                    kind = getattr(op.op, "__name__", "")
                    direction = "dst" if "send" in kind else "src"
                    peer = _global_peer(recorder._dist, op.peer, op.group, getattr(op, "group_peer", None))
                    recorder._record(kind, op.group, peer, direction, t0)
            except Exception as exc:  # noqa: BLE001
                _warn("record", "perftracker: a batch's groups not recorded (%s: %s)", type(exc).__name__, exc)
            return out

        wrapper._perftracker_wrapped = True  # type: ignore[attr-defined]
        return wrapper


_P2P = frozenset({"send", "isend", "recv", "irecv"})

# ---------------------------------------------------------------------- per window
_lock = threading.Lock()
_active: dict[str, CollectiveRecorder] = {}
_done: dict[str, tuple[tuple[tuple[str, str, tuple[int, ...]], ...], tuple[Call, ...]]] = {}


def window_started(session: str) -> None:
    """The window ``session`` opened (training thread): read the groups, start recording calls.
    Never raises."""
    try:
        rec = CollectiveRecorder()
        if rec.install():
            with _lock:
                _active[session] = rec
    except Exception as exc:  # noqa: BLE001
        _warn("start", "perftracker: collective recording not started (%s: %s)", type(exc).__name__, exc)


def window_ended(session: str) -> None:
    """The window ``session`` closed: stop recording, keep its groups and calls for its writer."""
    try:
        with _lock:
            rec = _active.pop(session, None)
        if rec is not None:
            rec.remove()
        groups = process_groups()
        calls = tuple(rec.calls) if rec is not None else ()
        if groups or calls:
            with _lock:
                _done[session] = (groups, calls)
                while len(_done) > _KEEP_SESSIONS:
                    _done.pop(next(iter(_done)))
    except Exception as exc:  # noqa: BLE001
        _warn("end", "perftracker: collective recording not ended cleanly (%s: %s)", type(exc).__name__, exc)


def recorded(session: str) -> tuple[tuple[tuple[str, str, tuple[int, ...]], ...], tuple[Call, ...]] | None:
    """(process groups, calls) recorded for the window ``session``; None when nothing was."""
    with _lock:
        return _done.get(session)
