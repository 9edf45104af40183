"""A set of ranks kept as sorted, disjoint half-open ranges (issue 33, item 2).

A session's expected ranks are "every rank below the registered world size" plus the registered
ones: one range for a whole job, whatever world size it claims. ``RankRanges`` holds them in
O(ranges) memory, answers ``in`` by bisection and counts without expanding; only what is really
listed (a report's missing ranks) is ever expanded, and that by the caller's choice.

Stored as JSON ``[[lo, hi), ...]`` pairs; a store written before holds a plain list of ranks, which
``from_json`` reads too.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np


class RankRanges:
    """An immutable set of non-negative ints as sorted disjoint ranges [lo, hi)."""

    __slots__ = ("_lo", "_hi", "_len")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[list[int]] = []
        for lo, hi in sorted((int(a), int(b)) for a, b in ranges if int(b) > int(a)):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self._lo = tuple(m[0] for m in merged)
        self._hi = tuple(m[1] for m in merged)
        self._len = sum(h - lo for lo, h in zip(self._lo, self._hi, strict=True))

    @classmethod
    def of(cls, ranks: Iterable[int]) -> RankRanges:
        """The ranges of a collection of ranks (consecutive ranks merge into one range)."""
        out: list[tuple[int, int]] = []
        for r in sorted({int(r) for r in ranks}):
            if out and out[-1][1] == r:
                out[-1] = (out[-1][0], r + 1)
            else:
                out.append((r, r + 1))
        return cls(out)

    @classmethod
    def span(cls, n: int) -> RankRanges:
        return cls([(0, n)])

    @property
    def end(self) -> int:
        """One past the largest rank (0 when empty)."""
        return self._hi[-1] if self._hi else 0

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._lo, self._hi, strict=True))

    def union(self, other: RankRanges | Iterable[int]) -> RankRanges:
        o = other if isinstance(other, RankRanges) else RankRanges.of(other)
        if not o._lo:
            return self
        if not self._lo:
            return o
        return RankRanges(self.ranges() + o.ranges())

    __or__ = union

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __contains__(self, rank: object) -> bool:
        try:
            rank = operator.index(rank)  # type: ignore[arg-type]
        except TypeError:
            return False
        i = bisect.bisect_right(self._lo, rank) - 1
        return i >= 0 and rank < self._hi[i]

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(map(range, self._lo, self._hi))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankRanges):
            return self._lo == other._lo and self._hi == other._hi
        if isinstance(other, (tuple, list)):
            return len(other) == self._len and list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._lo, self._hi))

    def __repr__(self) -> str:
        return f"RankRanges({self.ranges()!r})"

    def count_in(self, ranks: Iterable[int]) -> int:
        """How many of ``ranks`` (distinct) are in the set."""
        return sum(1 for r in ranks if r in self)

    def without(self, ranks: Iterable[int]) -> RankRanges:
        """The set minus ``ranks``: O((ranges + len(ranks)) log), never expanding the ranges (numpy)."""
        if not self._lo:
            return self
        seq = ranks if isinstance(ranks, (list, tuple, np.ndarray)) else list(ranks)
        cut = np.unique(np.asarray(seq, dtype=np.int64))
        if cut.size == 0:
            return self
        lo = np.array(self._lo, dtype=np.int64)
        hi = np.array(self._hi, dtype=np.int64)
        i = np.searchsorted(lo, cut, side="right") - 1
        cut = cut[(i >= 0) & (cut < hi[np.maximum(i, 0)])]
        if cut.size == 0:
            return self
        # each range [lo, hi) cut at c1 < c2 < ...: [lo, c1), [c1 + 1, c2), ..., [cm + 1, hi); the ranges
        # are disjoint and sorted, so the sorted starts and the sorted ends pair up
        starts = np.sort(np.concatenate((lo, cut + 1)))
        ends = np.sort(np.concatenate((cut, hi)))
        keep = starts < ends
        return RankRanges._sorted(starts[keep].tolist(), ends[keep].tolist())

    @classmethod
    def _sorted(cls, lo: list[int], hi: list[int]) -> RankRanges:
        """From ranges already sorted, disjoint and not touching (no merge pass)."""
        out = cls.__new__(cls)
        out._lo, out._hi = tuple(lo), tuple(hi)
        out._len = sum(hi) - sum(lo)
        return out

    def head(self, n: int) -> list[int]:
        """The first ``n`` ranks (a bounded listing)."""
        out: list[int] = []
        for lo, hi in zip(self._lo, self._hi, strict=True):
            out.extend(range(lo, min(hi, lo + n - len(out))))
            if len(out) >= n:
                break
        return out

    def to_json(self) -> list[list[int]]:
        """[[lo, hi], ...] (hi exclusive)."""
        return [[lo, hi] for lo, hi in zip(self._lo, self._hi, strict=True)]

    @classmethod
    def from_json(cls, value: Any) -> RankRanges:
        """``to_json``'s pairs, or a plain list of ranks (a store written before ranges)."""
        if not isinstance(value, list):
            raise ValueError(f"expected ranks: a list, got {type(value).__name__}")
        if value and isinstance(value[0], list):
            return cls((int(p[0]), int(p[1])) for p in value)
        return cls.of(int(r) for r in value)
