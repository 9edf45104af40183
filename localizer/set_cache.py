"""A bounded cache of parsed PatternSets, so that localizing a session re-parses nothing it can keep.

Every accepted upload is in the store; the cache only saves parsing it again. It holds at most
``max_bytes`` of (estimated) parsed size, dropping the least recently added sets first; a session
that lost any of its sets is read back from the store when it is localized. Without a bound, six
large uploads took the localizer from 167 to 894 MB (issue 17).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from perftracker.model import PatternSet

PER_PATTERN_BYTES = 450  # a parsed Pattern's objects besides its strings (measured: CPython 3.11)


def estimate_bytes(ps: PatternSet) -> int:
    """About the memory a parsed PatternSet holds (within ~10% for bench/load.py's sets)."""
    return 2048 + sum(PER_PATTERN_BYTES + len(p.key) + len(p.label) for p in ps.patterns)


class SetCache:
    """session -> rank -> PatternSet, bounded by estimated bytes (thread-safe)."""

    def __init__(self, max_bytes: int = 192 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, int], tuple[PatternSet, int]] = OrderedDict()
        self.bytes = 0
        self.evicted = 0

    def put(self, session: str, rank: int, ps: PatternSet) -> None:
        cost = estimate_bytes(ps)
        with self._lock:
            old = self._items.pop((session, rank), None)
            if old is not None:
                self.bytes -= old[1]
            if cost > self.max_bytes:
                self.evicted += 1
                return
            self._items[(session, rank)] = (ps, cost)
            self.bytes += cost
            while self.bytes > self.max_bytes:
                _, (_, c) = self._items.popitem(last=False)
                self.bytes -= c
                self.evicted += 1

    def sets(self, session: str) -> dict[int, PatternSet]:
        with self._lock:
            return {r: ps for (s, r), (ps, _) in self._items.items() if s == session}

    def forget(self, session: str) -> None:
        with self._lock:
            for key in [k for k in self._items if k[0] == session]:
                self.bytes -= self._items.pop(key)[1]
