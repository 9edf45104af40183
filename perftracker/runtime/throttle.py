"""Cooperative throttling for post-processing that runs beside training in the same process.

A Python thread that holds the GIL makes the training thread wait up to the switch interval (5 ms)
every time it comes back from a torch op, which can slow training several times over. Work loops
that run beside training call ``Throttle.tick()`` per item: after ``burst_s`` of work it sleeps
long enough to keep its share of the GIL at ``duty`` (0.25 by default), so training keeps going at
close to full speed while the window is written, and the writing takes longer instead. A set
``cancel`` event makes the next check raise ``Cancelled``, and a set ``hurry`` event ends the pauses
(the window's exit path uses both: hurry first, cancel when its time is up).
"""

from __future__ import annotations

import threading
import time

from perftracker.errors import PerftrackerError


class Cancelled(PerftrackerError):
    """The work was cancelled (the process is exiting); raised from ``Throttle.tick``."""


class Detached(PerftrackerError):
    """The work is to be handed to another process (the trainer is exiting, issue 30); raised from
    ``Throttle.tick`` when its ``detach`` event is set."""


class Throttle:
    def __init__(self, duty: float = 0.25, burst_s: float = 0.002, check_every: int = 64,
                 cancel: threading.Event | None = None, hurry: threading.Event | None = None,
                 detach: threading.Event | None = None) -> None:
        self.duty = min(max(duty, 0.01), 1.0)
        self.burst_ns = int(burst_s * 1e9)
        self.check_every = check_every
        self.cancel = cancel  # set -> the next check raises Cancelled
        self.hurry = hurry  # set -> no more pauses (the process is exiting and waits for this work)
        self.detach = detach  # set -> the next check raises Detached (the work goes to a forked child)
        self._n = 0
        self._t0 = time.monotonic_ns()
        self.slept_ns = 0

    def tick(self, n: int = 1) -> None:
        """Count ``n`` items of work; every ``check_every`` items, pause to keep the duty."""
        self._n += n
        if self._n < self.check_every:
            return
        self._n = 0
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("cancelled")
        if self.detach is not None and self.detach.is_set():
            raise Detached("handed to a child process")
        if self.duty >= 1.0 or (self.hurry is not None and self.hurry.is_set()):
            return
        busy = time.monotonic_ns() - self._t0
        if busy >= self.burst_ns:
            pause_ns = int(busy * (1.0 / self.duty - 1.0))
            time.sleep(pause_ns / 1e9)
            self.slept_ns += pause_ns
            self._t0 = time.monotonic_ns()


class NoThrottle(Throttle):
    def __init__(self) -> None:
        super().__init__(duty=1.0)

    def tick(self, n: int = 1) -> None:
        return
