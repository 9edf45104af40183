"""The agent's localizer-facing side: job registration, heartbeats, triggers, hang snapshots, the long poll.

The localizer client is a ``LocalizerUplink`` (perftracker.agent.daemon.localizer_client.Uplink:
blocking calls, each run here in a daemon thread of its own), so the embedded default can point it
at an in-process localizer without this package importing ``localizer``. Every call failure is
logged (once per kind) and retried by the loop that made it; nothing here raises into the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, ParamSpec, Protocol, TypeVar, cast

from perftracker.agent.daemon.agent_metrics import Metrics
from perftracker.agent.daemon.localizer_client import TriggerNotice
from perftracker.agent.daemon.options import AgentOptions
from perftracker.agent.daemon.workers import SILENT_AFTER_S, Worker, liveness, select_job

from perftracker.errors import PerftrackerError
from perftracker.model import HangSnapshot, PatternSet
from perftracker.model.trigger import Detection
from perftracker.warnonce import WarnOnce

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, Any], str], "asyncio.Task[Any]"]
P = ParamSpec("P")
R = TypeVar("R")


class LocalizerUplink(Protocol):
    """The localizer as the agent calls it (``Uplink``, perftracker.agent.daemon.localizer_client):
    blocking calls that raise a PerftrackerError when the localizer refuses or cannot be reached."""

    @property
    def url(self) -> str: ...

    def register(self, job: str, agent_id: str, host: str, workers: Sequence[Mapping[str, Any]]) -> object: ...

    def heartbeat(self, job: str, agent_id: str, ranks: Sequence[Mapping[str, Any]]) -> None: ...

    def create_trigger(self, job: str, reason: str = ..., window_s: float | None = ...,
                       detection: Mapping[str, Any] | None = ...) -> tuple[str, bool]: ...

    def upload_hang_snapshot(self, snap: HangSnapshot) -> object: ...

    def poll_trigger(self, job: str, after: str | None = ..., timeout_s: float = ...) -> TriggerNotice | None: ...

    def upload_patterns(self, ps: PatternSet, compressed: bool = ...) -> object: ...

    def upload_pattern_batch(self, sets: Sequence[PatternSet]) -> object: ...


class Upstream:
    """Talks to the localizer for one agent.

    ``workers`` is the daemon's live registry (read only here); ``spawn(coro, name)`` runs a task the
    daemon tracks; ``on_notice(job, notice)`` receives each session notice the long poll returns.
    """

    def __init__(self, options: AgentOptions, agent_id: str, uplink: LocalizerUplink, metrics: Metrics,
                 workers: Mapping[tuple[str, int], Worker], spawn: Spawn,
                 on_notice: Callable[[str, TriggerNotice], None]) -> None:
        self.options = options
        self.agent_id = agent_id
        self.uplink = uplink
        self.held: set[str] = set()  # jobs not registered anywhere until their localizer is known
        self.metrics = metrics
        self.workers = workers
        self.spawn = spawn
        self.on_notice = on_notice
        self.warn_once = WarnOnce(log)
        self._register_pending: dict[str, asyncio.TimerHandle] = {}
        self._registered: dict[str, frozenset[int]] = {}

    async def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)``, a blocking call of the uplink, awaited without blocking the loop."""
        # A daemon thread per blocking call (not the default executor): a long poll in flight must
        # not hold up the agent's exit.
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()

        def settle(ok: bool, value: object) -> None:
            if fut.done():
                return
            if ok:
                fut.set_result(cast(R, value))
            else:
                fut.set_exception(cast(BaseException, value))

        def work() -> None:
            res: object
            try:
                res, ok = fn(*args, **kwargs), True
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                res, ok = exc, False
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, ok, res)

        threading.Thread(target=work, name=f"uplink-{fn.__name__}", daemon=True).start()
        return await fut

    async def upload_patterns(self, ps: PatternSet) -> None:
        """One rank's PatternSet (perftracker.agent.daemon.window_session)."""
        await self.call(self.uplink.upload_patterns, ps)

    async def upload_pattern_batch(self, sets: Sequence[PatternSet]) -> None:
        """One node's PatternSets of one session, in one request (perftracker.agent.daemon.window_session)."""
        await self.call(self.uplink.upload_pattern_batch, sets)

    # ------------------------------------------------------------------ registration and heartbeats
    def schedule_register(self, job: str) -> None:
        """Register ``job``'s workers after a short debounce (workers connecting together: one call)."""
        if job in self.held:
            return  # its localizer is not known yet (a multi-node job: AgentDaemon's job link)
        loop = asyncio.get_running_loop()
        handle = self._register_pending.pop(job, None)
        if handle is not None:
            handle.cancel()
        self._register_pending[job] = loop.call_later(
            self.options.register_debounce_s, lambda: self.spawn(self.register_job(job), f"register-{job}"))

    async def register_job(self, job: str) -> None:
        self._register_pending.pop(job, None)
        workers = select_job(self.workers.values(), job, connected=False)
        ranks = frozenset(w.rank for w in workers)
        try:
            await self.call(self.uplink.register, job, self.agent_id, self.options.host, [w.info() for w in workers])
            self._registered[job] = ranks
            self.warn_once.clear("register")
        except PerftrackerError as exc:
            self._registered.pop(job, None)
            self.warn_once("register", "cannot register job %s with the localizer: %s (will retry)", job, exc)

    async def heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.heartbeat_s)
            for job in sorted({w.job for w in self.workers.values()} - self.held):
                workers = select_job(self.workers.values(), job, connected=False)
                if self._registered.get(job) != frozenset(w.rank for w in workers):
                    if job not in self._register_pending:
                        await self.register_job(job)
                    continue
                ranks = []
                for w in workers:
                    quiet_s = time.monotonic() - w.last_seen
                    alive, phase = True, w.phase
                    if not w.connected or quiet_s >= SILENT_AFTER_S:
                        # silent: say why in the phase ("stopped", "dead", ...), see perftracker.localizer.diagnose.incidents.hang
                        alive, state = liveness(w.pid, w.started)
                        phase = state if state in ("stopped", "disk_wait", "dead") else "silent"
                        if not alive and (w.phase == "exited" or w.phase.startswith("dead")):
                            phase = w.phase  # "exited" by itself, or "dead after rank N" (AgentDaemon._on_disconnect)
                    age = w.last_event_age_s + quiet_s  # idle_s was measured when last seen
                    ranks.append({"rank": w.rank, "iteration": max(-1, w.iteration), "phase": phase,
                                  "last_event_age_s": round(max(0.0, age), 3), "alive": alive,
                                  "iteration_ms": round(max(0.0, w.iteration_ms), 3)})
                    if w.work_session and alive:
                        ranks[-1]["working_on"] = w.work_session
                    if w.phases_ms:  # the hooks' phase times: the localizer's first look (issue 30)
                        ranks[-1]["phases_ms"] = w.phases_ms
                        if w.phases_before_ms:
                            ranks[-1]["phases_before_ms"] = w.phases_before_ms
                try:
                    await self.call(self.uplink.heartbeat, job, self.agent_id, ranks)
                    self.warn_once.clear("heartbeat")
                except PerftrackerError as exc:
                    self.warn_once("heartbeat", "heartbeat to the localizer failed: %s", exc)

    # ------------------------------------------------------------------ triggers and snapshots
    async def forward_trigger(self, w: Worker, reason: str, detail: dict[str, Any], window_s: float | None,
                              detection_json: Mapping[str, Any] | None = None) -> None:
        """Open or join a session for the worker's trigger, with its typed detection: the one the
        worker sent (checked with its message, workers.py), under the rank this agent registered it
        as; from a worker of before issue 48, read from its detail."""
        log.info("rank %d of job %s triggered: %s %s", w.rank, w.job, reason, detail)
        try:
            if detection_json is not None:
                detection = dataclasses.replace(Detection.from_dict(detection_json), rank=w.rank)
            else:
                detection = Detection.from_detail(w.rank, reason, detail)
            session, joined = await self.call(self.uplink.create_trigger, w.job, detection.reason_text(),
                                              window_s, detection.to_dict())
            log.info("trigger from rank %d %s session %s", w.rank, "joined" if joined else "opened", session)
        except PerftrackerError as exc:
            self.warn_once("trigger", "cannot forward a trigger to the localizer: %s", exc)

    async def upload_snapshot(self, w: Worker, snapshot: dict[str, Any]) -> None:
        if w.rank not in self._registered.get(w.job, frozenset()):
            # a worker that crashes right after it registered (a setup error): its job's registration
            # is still in its debounce, and the localizer refuses snapshots of unregistered ranks
            handle = self._register_pending.pop(w.job, None)
            if handle is not None:
                handle.cancel()
            await self.register_job(w.job)
        try:
            snap = HangSnapshot.from_dict(snapshot)
            await self.call(self.uplink.upload_hang_snapshot, snap)
            self.metrics.upload("hang_snapshot", ok=True)
            log.info("uploaded a hang snapshot of rank %d (job %s)", w.rank, w.job)
        except PerftrackerError as exc:
            self.metrics.upload("hang_snapshot", ok=False)
            log.warning("hang snapshot of rank %d not uploaded: %s", w.rank, exc)

    # ------------------------------------------------------------------ sessions
    async def poll_loop(self, job: str) -> None:
        """Long-poll the localizer for ``job``'s sessions; hand each new one to ``on_notice``."""
        after: str | None = None
        delay = 0.5
        while True:
            if not select_job(self.workers.values(), job, connected=False):
                await asyncio.sleep(1)
                continue
            try:
                notice = await self.call(self.uplink.poll_trigger, job, after, self.options.poll_timeout_s)
                delay = 0.5
                self.warn_once.clear("poll")
            except PerftrackerError as exc:
                self.warn_once("poll", "long poll to the localizer failed: %s (retrying)", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            if notice is None:
                continue
            after = notice.session
            self.on_notice(job, notice)


def describe_trigger(rank: int, reason: str, detail: dict[str, Any]) -> str:
    """The session's reason line, e.g. "rank 2: slowdown at iteration 312 (+18% over 45.1 ms)"
    (``Detection.reason_text``; the report carries the Detection itself)."""
    return Detection.from_detail(rank, reason, detail).reason_text()
