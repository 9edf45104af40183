"""Cooperative throttling for post-processing that runs beside training in the same process.

A Python thread that holds the GIL makes the training thread wait up to the switch interval (5 ms)
every time it comes back from a torch op, which can slow training several times over. Work loops
that run beside training call ``Throttle.tick()`` per item: after ``burst_s`` of work it sleeps
long enough to keep its share of the GIL at ``duty`` (0.25 by default), so training keeps going at
close to full speed while the window is written, and the writing takes longer instead.
"""

from __future__ import annotations

import time


class Throttle:
    def __init__(self, duty: float = 0.25, burst_s: float = 0.002, check_every: int = 64) -> None:
        self.duty = min(max(duty, 0.01), 1.0)
        self.burst_ns = int(burst_s * 1e9)
        self.check_every = check_every
        self._n = 0
        self._t0 = time.monotonic_ns()
        self.slept_ns = 0

    def tick(self) -> None:
        self._n += 1
        if self._n < self.check_every or self.duty >= 1.0:
            return
        self._n = 0
        busy = time.monotonic_ns() - self._t0
        if busy >= self.burst_ns:
            pause_ns = int(busy * (1.0 / self.duty - 1.0))
            time.sleep(pause_ns / 1e9)
            self.slept_ns += pause_ns
            self._t0 = time.monotonic_ns()


class NoThrottle(Throttle):
    def __init__(self) -> None:
        super().__init__(duty=1.0)

    def tick(self) -> None:
        return
