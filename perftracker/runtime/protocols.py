"""The runtime as its parts see it: small Protocols at the seams (docs/design.md section 8).

``Runtime`` (perftracker.runtime.runtime) is every one of them; ``RuntimeIdentity``
(perftracker.runtime.identity) is a ``WorkerIdentity``. Each part names only what it uses, so a test
passes a stand-in with those members and nothing else. Pure typing: no import of the runtime.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from perftracker.config import Config
from perftracker.runtime.sinks import TriggerSink

if TYPE_CHECKING:
    from perftracker.runtime.trigger.policy import TriggerPolicy


class WorkerIdentity(Protocol):
    """Who this training process is: its job, ranks, host, pid and training thread."""

    @property
    def job(self) -> str: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def local_rank(self) -> int: ...

    @property
    def host(self) -> str: ...

    @property
    def pid(self) -> int: ...

    @property
    def training_tid(self) -> int: ...


class ProfilingDetector(Protocol):
    """The detector as a profile window tells it that its iteration times are perturbed."""

    def set_profiling(self, active: bool, window_s: float | None = None) -> None: ...


class WindowRuntime(Protocol):
    """The runtime as a profile window (perftracker.runtime.window.profile) hooks into it."""

    @property
    def detector(self) -> ProfilingDetector: ...

    def add_boundary_listener(self, fn: Callable[[int, int], None]) -> None: ...


class LocalRuntime(WindowRuntime, Protocol):
    """The runtime as the worker's own windows (perftracker.runtime.window.local) profile it."""

    @property
    def identity(self) -> WorkerIdentity: ...

    @property
    def config(self) -> Config: ...


class WorkerState(Protocol):
    """Who the process is and how far it trained (perftracker.runtime.agent_connect)."""

    @property
    def identity(self) -> WorkerIdentity: ...

    @property
    def iteration(self) -> int: ...


class SnapshotRuntime(WorkerState, Protocol):
    """The runtime as a hang snapshot reads it from another thread (perftracker.runtime.hang_capture).
    Its ``clock`` (a ``Clock``) is optional there: a stand-in without one is read with time.monotonic_ns."""

    def last_event(self) -> tuple[str, int] | None: ...


class ChannelRuntime(SnapshotRuntime, WindowRuntime, Protocol):
    """The runtime as the agent channel (perftracker.runtime.channel) drives it: it reads the state,
    takes its triggers (``set_sink``), settles its identity, polls for a blocked job and profiles."""

    def recent_iteration_ms(self) -> list[float]: ...

    def set_sink(self, sink: TriggerSink) -> None: ...

    def settle_identity(self, store_wait_s: float = 30.0, exiting: bool = False) -> bool: ...

    def check_blocked(self, now_ns: int | None = None, notify: bool = True,
                      extra_s: float = 0.0) -> dict[str, object] | None: ...

    # the trigger policy (hold, budget: perftracker/runtime/trigger/policy.py) is the runtime's; the
    # channel asks it for the window cost meter and, every few seconds, to release a held trigger
    @property
    def trigger_policy(self) -> TriggerPolicy | None: ...

    def release_held_trigger(self) -> bool: ...


class FinishedWindow(Protocol):
    """A profile window's outcome as WINDOW_DONE reports it (``WindowResult``, perftracker.runtime.window.profile)."""

    @property
    def session(self) -> str: ...

    @property
    def raw_path(self) -> os.PathLike[str] | str | None: ...

    @property
    def samples_path(self) -> os.PathLike[str] | str | None: ...

    @property
    def start_ns(self) -> int: ...

    @property
    def end_ns(self) -> int: ...

    @property
    def error(self) -> str: ...


class ArmableWindow(Protocol):
    """A profile window as the channel arms it (``ProfileWindow``): ``on_done`` is called once."""

    def arm(self, session: str, window_s: float, on_done: Callable[[FinishedWindow], None]) -> bool: ...
