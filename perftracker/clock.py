"""The Clock seam. Library code asks a Clock for time; tests pass a fake one."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int:
        """Monotonic nanoseconds (CLOCK_MONOTONIC on Linux): the shared time base."""
        ...


class MonotonicClock:
    """The real clock: time.monotonic_ns, i.e. CLOCK_MONOTONIC, the same base procfs samplers use."""

    def now_ns(self) -> int:
        return time.monotonic_ns()


class FakeClock:
    """A settable clock for tests of pure logic."""

    def __init__(self, start_ns: int = 0) -> None:
        self.t_ns = start_ns

    def now_ns(self) -> int:
        return self.t_ns

    def advance_s(self, seconds: float) -> None:
        self.t_ns += int(seconds * 1e9)

    def advance_ns(self, ns: int) -> None:
        self.t_ns += ns
