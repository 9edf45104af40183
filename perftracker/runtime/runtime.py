"""The per-process Runtime: hooks -> detector -> sink, plus the contract API other stages build on.

One Runtime per training process (``get_runtime()``). The hook callbacks are the hot path: they
read the clock and append to an event log; at least every 20 ms (at every event while a boundary
listener is set) the log goes to the detector in one pass, which collects a pending trigger and
calls the boundary listeners at each iteration boundary (docs/overhead.md). Anything that raises
inside a hook or the detector disables perftracker in this process (logged once); training goes on.

Thread model:
- hooks, boundary listeners and detector triggers run in the training (main) thread;
- ``check_blocked`` is meant to be polled by another thread (the controller): it only reads;
- ``trigger``, ``status``, ``last_event``, ``recent_iteration_ms`` may be called from any thread.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from perftracker.clock import Clock, MonotonicClock
from perftracker.config import Config
from perftracker.runtime import hooks
from perftracker.runtime.detector import KIND_NAMES, Detector, DetectorOptions
from perftracker.runtime.hooks import DATA_DONE, DATA_NEXT, STEP_POST, STEP_PRE
from perftracker.runtime.identity import RuntimeIdentity, provisional_identity, settle_identity
from perftracker.runtime.phase_times import PhaseTimes
from perftracker.runtime.sinks import LoggingSink, TriggerSink

if TYPE_CHECKING:  # created at the first hooked event (perftracker/runtime/activation.py)
    from perftracker.runtime.trigger.policy import TriggerPolicy

log = logging.getLogger(__name__)

BoundaryListener = Callable[[int, int], None]


def identity_from_env(config: Config, environ: Mapping[str, str] | None = None) -> RuntimeIdentity:
    """The provisional identity at import (perftracker/runtime/identity.py): torchrun's environment, or rank 0
    of a job named after the script. The channel settles it from the process group before it
    registers with the node agent."""
    return provisional_identity(config.job_id, environ)


class Runtime:
    """Owns the detector of this process and delivers its triggers to a sink."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        clock: Clock | None = None,
        sink: TriggerSink | None = None,
        identity: RuntimeIdentity | None = None,
    ) -> None:
        self.config = config or Config()
        self.clock = clock or MonotonicClock()
        self.identity = identity or identity_from_env(self.config)
        self.detector = Detector(DetectorOptions.from_config(self.config), self.clock)
        self._sink: TriggerSink = sink or LoggingSink()
        self._listeners: tuple[BoundaryListener, ...] = ()
        # the real clock is time.monotonic_ns itself: one call less on the hot path
        self.now_ns = time.monotonic_ns if type(self.clock) is MonotonicClock else self.clock.now_ns
        self.phases = PhaseTimes()  # per-step data / step / rest times from the hooks (the first look)
        # the event log: hook events wait here ((t_ns << 2) | code, codes in hooks.py) and reach
        # the detector and the phase times in one warm pass once an event comes at or after
        # due_ns (every event while listeners are set)
        self._events: list[int] = []
        self.log_event = self._events.append  # the list is emptied in place, never replaced
        self.due_ns = 0
        self._hook_ident = -1  # the thread that runs the hooks (seen at the last flush)
        self._log_ns = int(self.detector.options.batch_ms * 1e6)
        self._blocked_episode_ns = -1  # last_t_ns of the episode already reported to the sink
        self._failed_once: set[str] = set()
        self.triggers: deque[dict[str, object]] = deque(maxlen=100)
        # hold and budget (perftracker/runtime/trigger/policy.py): set when the process starts
        # training with an agent channel (perftracker/runtime/activation.py); None: every trigger goes
        self.trigger_policy: TriggerPolicy | None = None
        self.active = False
        self.error = ""

    # ----------------------------------------------------------------------------------------
    # contract API
    # ----------------------------------------------------------------------------------------
    @property
    def iteration(self) -> int:
        """Completed iterations (before the sequence is learned: optimizer steps). Exact in the
        training thread; from another thread at most ``batch_ms`` of events late."""
        self._sync()
        iteration = self.detector.iteration
        pending = list(self._events)  # another thread: the boundaries still in the log count too
        if not pending:
            return iteration
        return iteration + self.detector.boundaries_in([(e >> 1) & 1 for e in pending if not e & 1])

    def _sync(self) -> None:
        """In the thread that runs the hooks, feed the event log to the detector now."""
        if self._events and threading.get_ident() == self._hook_ident:
            self._flush(self._events[-1] >> 2, from_hook=False)

    def settle_identity(self, store_wait_s: float = 30.0, exiting: bool = False) -> bool:
        """Replace the provisional identity with the real one once it can be known (from the process
        group, or because this process trains alone); see perftracker/runtime/identity.py. Call it from a
        background thread (it may wait on the default store). Whether the identity is settled."""
        if self.identity.settled:
            return True
        settled = settle_identity(self.identity, self.config.job_id, self.detector.iteration,
                                  store_wait_s=store_wait_s, exiting=exiting)
        if settled is None:
            return False
        if settled != self.identity:
            log.info("perftracker: identity settled from the %s: job %s rank %d/%d (local rank %d)",
                     settled.source, settled.job, settled.rank, settled.world_size, settled.local_rank)
        self.identity = settled
        return True

    def add_boundary_listener(self, fn: BoundaryListener) -> None:
        """``fn(t_ns, iteration)`` runs in the training thread right after each boundary event."""
        if fn not in self._listeners:
            self._listeners = (*self._listeners, fn)
        self.due_ns = 0  # from the next event on, every event reaches the detector at once

    def remove_boundary_listener(self, fn: BoundaryListener) -> None:
        self._listeners = tuple(f for f in self._listeners if f is not fn and f != fn)

    def set_sink(self, sink: TriggerSink) -> None:
        self._sink = sink

    @property
    def sink(self) -> TriggerSink:
        return self._sink

    def last_event(self) -> tuple[str, int] | None:
        """(kind, t_ns) of the latest hook event: dataloader.next, optimizer.step(.pre)."""
        det = self.detector
        tail = self._events[-3:]  # not yet fed (any thread: a slice is taken atomically)
        kind, t_ns, pre_t_ns = det.last_kind, det.last_t_ns, self.phases.pre_ns
        for e in tail:  # the log holds events after the detector's and the phases' latest
            code = e & 3
            if code == STEP_PRE:
                pre_t_ns = e >> 2
            elif code != DATA_DONE:
                kind, t_ns = code >> 1, e >> 2
        if pre_t_ns > t_ns:
            return "optimizer.step.pre", pre_t_ns
        if t_ns < 0:
            return None
        return KIND_NAMES[kind], t_ns

    def training_started_s(self) -> float | None:
        """When the first hook event came (monotonic s, the clock's); None before any. Any thread."""
        t_ns = self.detector.first_t_ns
        return t_ns / 1e9 if t_ns >= 0 else None

    def last_boundary_s(self) -> float | None:
        """When the latest iteration boundary came (monotonic s); None before any. Any thread."""
        self._sync()
        t_ns = self.detector.last_boundary_ns
        return t_ns / 1e9 if t_ns >= 0 else None

    def recent_iteration_ms(self) -> list[float]:
        """Durations of the last W completed iterations, oldest first."""
        self._sync()
        return [d / 1e6 for d in list(self.detector.durations_ns)]

    def check_blocked(self, now_ns: int | None = None, notify: bool = True,
                      extra_s: float = 0.0) -> dict[str, object] | None:
        """Poll from any thread. A detail mapping while blocked, else None.

        Blocked: no hook event for max(blocked_factor x mean iteration, blocked_min_s), plus
        ``extra_s`` (the channel adds a profile window's length around a window). With ``notify``
        the sink's ``on_blocked`` is called once per episode (an episode ends with the next hook
        event), in the calling thread.
        """
        if not self.active:
            return None
        detail = self.detector.check_blocked(now_ns, extra_s) if extra_s > 0 else self.detector.check_blocked(now_ns)
        if detail is None:
            return None
        detail = {**detail, **self._identity_fields()}
        episode = int(detail["last_event_ns"])  # type: ignore[call-overload]
        if notify and episode != self._blocked_episode_ns:
            self._blocked_episode_ns = episode
            self.triggers.append({"type": "blocked", **detail})
            try:
                self._sink.on_blocked(detail)
            except Exception as exc:
                self._log_once("sink.on_blocked", exc)
        return detail

    def trigger(self, reason: str, detail: Mapping[str, object] | None = None) -> bool:
        """An on-demand trigger from any thread; False if perftracker is not active."""
        if not self.active:
            log.warning("perftracker: trigger(%r) ignored: not active (%s)", reason, self.error or "off")
            return False
        full = {"source": "manual", "iteration": self.iteration, **(detail or {}), **self._identity_fields()}
        self._deliver(reason, full)
        return True

    def status(self) -> dict[str, object]:
        self._sync()
        det = self.detector
        durations = list(det.durations_ns)
        phase = det.phase if self.active else ("failed" if self.error else "inactive")
        return {
            "active": self.active,
            "phase": phase,
            "mode": det.options.mode,
            "sequence": det.sequence_names(),
            "iteration": det.iteration,
            "learned_at_iteration": det.learned_at_iteration,
            "relearn_count": det.relearn_count,
            "recent_mean_ms": (sum(durations) / len(durations) / 1e6) if durations else None,
            "recent_min_ms": (min(durations) / 1e6) if durations else None,
            "recent_iteration_ms": [d / 1e6 for d in durations],
            "blocked_limit_s": det.blocked_limit_ns() / 1e9,
            "triggers": list(self.triggers),
            "suppressed_triggers": dict(det.suppressed),
            "trigger_tokens": det.gate.tokens(max(det.last_t_ns, 0)),
            "identity": self.identity.to_dict(),
            "error": self.error,
        }

    # ----------------------------------------------------------------------------------------
    # lifecycle
    # ----------------------------------------------------------------------------------------
    def start(self, install: bool = True) -> None:
        """Active from now on; ``install``: the hooks call this runtime at once (imports torch). The
        import-time path installs them itself (perftracker/runtime/activation.py)."""
        if install:
            hooks.install(self)
        self.active = True

    def stop(self) -> None:
        self.active = False
        _remove_hooks()
        window = sys.modules.get("perftracker.runtime.window.profile")
        if window is not None:  # no boundary will come to close an open profile window
            window.shutdown_all("perftracker deactivated")

    # ----------------------------------------------------------------------------------------
    # hook callbacks: the hot path (hooks.py catches whatever they raise)
    # ----------------------------------------------------------------------------------------
    # **[decision]** A hook only appends to the event log; the detector sees the log in one pass
    # at least every ``batch_ms`` (20 ms), and at every event while a boundary listener is set (a
    # profile window). Between 1 ms of torch work, each Python line of the detector ran with cold
    # caches: the runtime cost a 1 ms training loop 9-16 µs per iteration, several times its warm
    # cost (docs/overhead.md). Readers from other threads (status, heartbeats, blocked checks) see
    # the detector at most batch_ms late.
    # The hooks in hooks.py write the log themselves (no call into this class per hook event); the
    # four methods below do the same for callers without torch hooks (tests, other frameworks).
    def on_dataloader_next(self) -> None:
        t_ns = self.now_ns()
        self.log_event((t_ns << 2) | DATA_NEXT)
        if t_ns >= self.due_ns:
            self.flush(t_ns)

    def on_dataloader_done(self) -> None:
        self.log_event((self.now_ns() << 2) | DATA_DONE)

    def on_step_pre(self) -> None:
        self.log_event((self.now_ns() << 2) | STEP_PRE)

    def on_step_post(self) -> None:
        t_ns = self.now_ns()
        self.log_event((t_ns << 2) | STEP_POST)
        if t_ns >= self.due_ns:
            self.flush(t_ns)

    @property
    def _pre_t_ns(self) -> int:
        """The latest optimizer step's pre-hook time fed (a window's convergence test reads it at a
        boundary, when the log has just been fed)."""
        return self.phases.pre_ns

    @property
    def _post_t_ns(self) -> int:
        return self.phases.post_ns

    def flush(self, now_ns: int) -> None:
        """A hook's event came at or after ``due_ns``: feed the log (hooks.py)."""
        self._flush(now_ns)

    def _flush(self, now_ns: int, from_hook: bool = True) -> None:
        """Feed the event log to the phase times and the detector, in order, with the boundary work
        at each boundary. Boundary listeners run only for the event a hook is handling now (not
        from ``_sync``)."""
        events = self._events[:]
        self._events.clear()
        self._hook_ident = threading.get_ident()
        self.phases.feed(events)
        det = self.detector
        det_events = [e >> 1 for e in events if not e & 1]  # (t_ns << 1) | kind: the detector's
        boundary = det.feed(det_events)
        # listeners (a window's start, its iteration marks) only at a boundary happening now: the
        # first pass after a listener is added may hold boundaries up to batch_ms old
        listeners = boundary and from_hook and bool(self._listeners)
        if listeners or det.pending is not None:
            self._boundary(det_events[-1] >> 1 if det_events else now_ns, listeners=listeners)
        self.due_ns = 0 if self._listeners else now_ns + self._log_ns

    def _boundary(self, t_ns: int, listeners: bool = True) -> None:
        """An iteration boundary with something to do: a pending trigger, or boundary listeners."""
        if self.detector.pending is not None:
            detail = self.detector.pop_trigger()
            if detail is not None:
                self._deliver("slowdown", {"source": "detector", **detail, **self._identity_fields()})
        if not listeners:
            return
        iteration = self.detector.iteration
        for fn in self._listeners:
            try:
                fn(t_ns, iteration)
            except Exception as exc:
                self._log_once(f"listener {getattr(fn, '__qualname__', fn)!s}", exc)

    def hook_failed(self, where: str, exc: BaseException) -> None:
        """Called by hooks.py after a hook raised: log once and disable perftracker here."""
        self.active = False
        self.error = f"{where}: {type(exc).__name__}: {exc}"
        log.error(
            "perftracker disabled in this process after an internal error in %s; training continues",
            where,
            exc_info=exc,
        )
        if where == "dataloader.next":
            hooks.uninstall()  # safe here; optimizer hooks cannot be removed while torch runs them

    # ----------------------------------------------------------------------------------------
    def _identity_fields(self) -> dict[str, object]:
        i = self.identity
        return {"rank": i.rank, "world_size": i.world_size, "host": i.host, "pid": i.pid, "job": i.job}

    def _deliver(self, reason: str, detail: dict[str, object]) -> None:
        self.triggers.append({"type": "trigger", "reason": reason, **detail})
        try:
            policy = self.trigger_policy
            if policy is None or policy.admit(reason, detail):
                self._sink.on_trigger(reason, detail)
        except Exception as exc:
            self._log_once("sink.on_trigger", exc)

    def release_held_trigger(self) -> bool:
        """Any thread (the agent channel's, every few seconds): send a trigger the policy held once it
        is worth a window; the detector then restarts its post-window check. Whether one went."""
        policy = self.trigger_policy
        due = policy.due() if policy is not None else None
        if due is None:
            return False
        self.detector.trigger_sent_late(time.monotonic_ns())
        try:
            self._sink.on_trigger(*due)
        except Exception as exc:
            self._log_once("sink.on_trigger", exc)
        return True

    def _log_once(self, where: str, exc: BaseException) -> None:
        if where in self._failed_once:
            return
        self._failed_once.add(where)
        log.error("perftracker: %s raised; ignored (logged once)", where, exc_info=exc)


# ----------------------------------------------------------------------------------------------
# the process-wide runtime
# ----------------------------------------------------------------------------------------------
_runtime: Runtime | None = None
_last: Runtime | None = None
_lock = threading.Lock()


def get_runtime() -> Runtime | None:
    """The active Runtime of this process, or None (disabled, failed or never activated)."""
    rt = _runtime
    return rt if rt is not None and rt.active else None


def _remove_hooks() -> None:
    """Remove the hooks if they are installed; never imports torch (a process without it has none)."""
    if hooks.is_installed():
        hooks.uninstall()
    else:
        hooks.detach()


def activate(
    config: Config | None = None, *, clock: Clock | None = None, sink: TriggerSink | None = None,
    install: bool = True,
) -> Runtime:
    """Start detection in this process. With no arguments and an active Runtime, return it.
    ``install=False``: the caller installs the hooks (perftracker/runtime/activation.py)."""
    global _runtime, _last
    with _lock:
        if _runtime is not None and _runtime.active and config is None and clock is None and sink is None:
            return _runtime
        if _runtime is not None:
            _runtime.stop()
        rt = Runtime(config or Config.from_env(), clock=clock, sink=sink)
        rt.start(install=install)
        _runtime = _last = rt
        return rt


def deactivate() -> None:
    """Stop detection and restore torch exactly as it was before activate()."""
    global _runtime
    with _lock:
        if _runtime is not None:
            _runtime.stop()
            _runtime = None
        else:
            _remove_hooks()


def last_runtime() -> Runtime | None:
    """The latest Runtime even if it was deactivated or failed (for status)."""
    return _last
