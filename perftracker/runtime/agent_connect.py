"""How a worker reaches its node agent: connect to ``<run_dir>/agent.sock``, and start an agent
(perftracker.runtime.autostart) when none answers, but only for a process that trains.

Used by the channel thread (perftracker.runtime.channel); never raises for a missing agent.
"""

from __future__ import annotations

import logging
import socket
import time

from perftracker.config import Config
from perftracker.errors import TransportError
from perftracker.runtime.protocols import WorkerState
from perftracker.warnonce import WarnOnce
from perftracker.wire import framing as wire

log = logging.getLogger(__name__)


class AgentConnector:
    """Connects to the agent at ``path``; at most one autostart attempt per ``autostart_every_s``."""

    def __init__(self, path: str, runtime: WorkerState, config: Config, connect_timeout_s: float,
                 autostart_every_s: float, warn_once: WarnOnce) -> None:
        self.path = path
        self.runtime = runtime
        self.config = config
        self.connect_timeout_s = connect_timeout_s
        self.autostart_every_s = autostart_every_s
        self._warn_once = warn_once
        self._last_autostart = -1.0  # monotonic time of the last autostart attempt; <0: none yet
        self._autostart_failed = False  # an autostart failed: ensure_agent logged why; retries stay quiet

    def connect(self) -> socket.socket | None:
        """A connected socket, or None (logged once) when no agent answers."""
        try:
            return wire.connect(self.path, self.connect_timeout_s)
        except TransportError as exc:
            first_error = exc
        if self.may_autostart():
            now = time.monotonic()
            if self._last_autostart < 0 or now - self._last_autostart >= self.autostart_every_s:
                self._last_autostart = now
                from perftracker.runtime import autostart

                announce = int(self.runtime.identity.local_rank or 0) == 0
                if not autostart.ensure_agent(self.config, announce=announce):
                    self._autostart_failed = True
                    return None  # ensure_agent said why, in one line (local rank 0)
                try:
                    return wire.connect(self.path, self.connect_timeout_s)
                except TransportError as exc:
                    first_error = exc
        if self.autostart_pending() or self._autostart_failed:  # (a failed autostart said why, once)
            log.debug("perftracker: no node agent at %s yet (%s)", self.path, first_error)
        else:
            self._warn_once("connect", "perftracker: no node agent at %s (%s); training continues, retrying with "
                            "backoff", self.path, first_error)
        return None

    def autostart_pending(self) -> bool:
        return self.config.autostart_agent and self._last_autostart < 0 and int(self.runtime.iteration or 0) < 1

    def may_autostart(self) -> bool:
        """Start an agent only for a process that trains (one iteration done) and only with
        ``autostart_agent`` (PERFTRACKER_AUTOSTART_AGENT; the test suite sets it to 0 for itself)."""
        if not self.config.autostart_agent:
            return False
        try:
            return int(self.runtime.iteration or 0) >= 1
        except Exception:  # noqa: BLE001
            return False

    def retry_delay(self, delay: float) -> float:
        """While an autostart is still to come (waiting for the first iteration), poll quickly."""
        return min(delay, 0.5) if self.autostart_pending() else delay
