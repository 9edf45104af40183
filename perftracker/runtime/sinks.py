"""Where triggers go. The Runtime calls a ``TriggerSink``; the agent connection (a later stage)
provides its own. Until then ``LoggingSink`` logs each trigger and keeps it for ``status()``.

``on_trigger`` is called in the thread that raised it: the training thread for detector triggers
(inside a hook, so it must return quickly and never block), the caller's thread for
``perftracker.trigger``. ``on_blocked`` is called in the thread that polls
``Runtime.check_blocked`` (the controller thread). Exceptions a sink raises are caught by the
Runtime and logged once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class TriggerSink(Protocol):
    def on_trigger(self, reason: str, detail: Mapping[str, object]) -> None:
        """A slowdown ("slowdown"), on-demand ("manual: ...") or other trigger."""
        ...

    def on_blocked(self, detail: Mapping[str, object]) -> None:
        """The job looks blocked (no hook event for the blocked limit); once per episode."""
        ...


class LoggingSink:
    """Logs every trigger at WARNING and records the last ``keep`` of them (thread-safe)."""

    def __init__(self, keep: int = 100) -> None:
        self._lock = threading.Lock()
        self.records: deque[dict[str, object]] = deque(maxlen=keep)

    def on_trigger(self, reason: str, detail: Mapping[str, object]) -> None:
        log.warning("perftracker trigger: %s %s", reason, dict(detail))
        self._record({"type": "trigger", "reason": reason, "time_ns": time.time_ns(), **detail})

    def on_blocked(self, detail: Mapping[str, object]) -> None:
        log.warning("perftracker: training looks blocked: %s", dict(detail))
        self._record({"type": "blocked", "reason": "blocked", "time_ns": time.time_ns(), **detail})

    def _record(self, record: dict[str, object]) -> None:
        with self._lock:
            self.records.append(record)

    def snapshot(self) -> list[dict[str, object]]:
        with self._lock:
            return list(self.records)
