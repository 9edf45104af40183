"""Slowdown rules over a stream of iteration durations (DESIGN.md section 3). Pure: no clock, no I/O.

Two rules share one small interface (``observe(duration_ns) -> detail | None`` and ``reset()``):

- ``PaperRule``: the PerfTracker paper's rule. The mean of the last W iterations exceeds the
  recent shortest iteration by more than ``threshold``. **[decision]** "recent shortest" is the
  minimum over the same last W iterations, so the rule forgets a level once it has left the window.
- ``ChangepointRule``: robust change-point detection on log iteration times. A rolling reference
  (median and MAD of the iterations just before the test windows) gives the level and the noise;
  short windows (5, 10, 20 iterations, each with its largest value trimmed so that one spike such
  as a checkpoint save counts for nothing) fire when their trimmed mean exceeds the reference by
  more than ``max(log(1 + threshold), z * noise / sqrt(k - 1))``. A slow drift is caught against
  an anchor, the lowest block median over the last ``anchor_blocks`` blocks.

Both rules re-baseline after firing, so a sustained slowdown fires once: the paper rule refills its
window; the changepoint rule takes the window that fired as its new reference and tests again as
soon as its shortest window refills.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

_MAD_TO_SIGMA = 1.4826
_MEDIAN_SE = 1.2533  # standard error of a median, in units of sigma / sqrt(n), for a normal


class SlowdownRule(Protocol):
    def observe(self, duration_ns: int) -> dict[str, object] | None:
        """Feed one completed iteration; return a detail mapping when the rule fires."""
        ...

    def reset(self) -> None:
        """Forget all history (after a trigger, or when the iteration sequence changes)."""
        ...


@dataclass(frozen=True)
class PaperOptions:
    window_iters: int = 50  # W
    threshold: float = 0.05  # 5 %


class PaperRule:
    """Mean of the last W iterations > (1 + threshold) * min of the last W iterations."""

    def __init__(self, options: PaperOptions | None = None) -> None:
        self.options = options or PaperOptions()
        self._w = self.options.window_iters
        self._factor = 1.0 + self.options.threshold
        self._values: deque[int] = deque()
        self._mins: deque[int] = deque()  # monotonic deque: rolling minimum of _values
        self._sum = 0

    def reset(self) -> None:
        self._values.clear()
        self._mins.clear()
        self._sum = 0

    def observe(self, duration_ns: int) -> dict[str, object] | None:
        values, mins = self._values, self._mins
        values.append(duration_ns)
        self._sum += duration_ns
        while mins and mins[-1] > duration_ns:
            mins.pop()
        mins.append(duration_ns)
        if len(values) > self._w:
            old = values.popleft()
            self._sum -= old
            if mins[0] == old:
                mins.popleft()
        if len(values) < self._w:
            return None
        mean_ns = self._sum / self._w
        shortest_ns = mins[0]
        if mean_ns > self._factor * shortest_ns:
            detail: dict[str, object] = {
                "rule": "paper",
                "mean_ms": mean_ns / 1e6,
                "shortest_ms": shortest_ns / 1e6,
                "ratio": mean_ns / shortest_ns,
                "window_iters": self._w,
            }
            self.reset()
            return detail
        return None


@dataclass(frozen=True)
class ChangepointOptions:
    threshold: float = 0.05  # minimum relative slowdown worth a trigger (same as the paper's 5 %)
    z: float = 5.0  # how many noise standard errors a window must exceed the reference by
    ref_iters: int = 300  # reference window (iterations just before the test windows)
    min_ref_iters: int = 30  # iterations needed in the reference before testing
    windows: tuple[int, ...] = (5, 10, 20)
    block_iters: int = 25  # reference statistics are refreshed every block
    anchor_blocks: int = 40  # drift anchor: lowest block median over this many blocks
    min_noise: float = 0.002  # floor on the relative noise (perfectly regular series)


class ChangepointRule:
    """Multi-window robust level-shift test on log durations, plus a drift test against an anchor."""

    def __init__(self, options: ChangepointOptions | None = None) -> None:
        o = self.options = options or ChangepointOptions()
        self._windows = tuple(sorted(o.windows))
        self._kmax = self._windows[-1]
        self._log_thr = math.log1p(o.threshold)
        self._recent: deque[float] = deque(maxlen=self._kmax)
        self._ref: deque[float] = deque(maxlen=o.ref_iters)
        self._anchors: deque[float] = deque(maxlen=o.anchor_blocks)
        self._since_block = 0
        self._level = math.nan  # reference median (log ns)
        self._noise = math.nan  # reference robust sigma (log units)
        self._bounds: tuple[float, ...] = ()
        self._sums = [0.0] * len(self._windows)
        self._noise_floor = 0.0  # after a rebase: the noise seen before it (stay conservative)

    def reset(self) -> None:
        self._recent.clear()
        self._ref.clear()
        self._anchors.clear()
        self._sums = [0.0] * len(self._windows)
        self._since_block = 0
        self._level = math.nan
        self._noise = math.nan
        self._noise_floor = 0.0
        self._bounds = ()

    def _rebase(self, seed: list[float]) -> None:
        """After firing: the values that fired (the new level) become the whole reference.

        Testing resumes as soon as the shortest window refills, against that level, with the
        earlier noise as a floor; a transient burst therefore blinds the rule for a few iterations
        only, and a sustained slowdown fires once.
        """
        noise = self._noise
        self.reset()
        self._ref.extend(seed)
        self._noise_floor = noise if noise == noise else 0.0
        self._refresh(drift=False)

    def _refresh(self, drift: bool = True) -> dict[str, object] | None:
        """Recompute level, noise, window bounds and the drift anchor; test the drift."""
        o = self.options
        ref = sorted(self._ref)
        n = len(ref)
        mid = n // 2
        level = ref[mid] if n % 2 else 0.5 * (ref[mid - 1] + ref[mid])
        devs = sorted(abs(x - level) for x in ref)
        mad = devs[mid] if n % 2 else 0.5 * (devs[mid - 1] + devs[mid])
        noise = max(_MAD_TO_SIGMA * mad, o.min_noise, self._noise_floor)
        self._level, self._noise = level, noise
        self._bounds = tuple(
            level + max(self._log_thr, o.z * noise / math.sqrt(k - 1)) for k in self._windows
        )
        if not drift:
            return None
        # drift: the median of the latest block against the lowest block median seen recently
        block = sorted(list(self._ref)[-2 * o.block_iters :])
        block_median = block[len(block) // 2]
        anchor = min(self._anchors) if self._anchors else block_median
        self._anchors.append(block_median)
        if len(self._anchors) >= 4:
            se = _MEDIAN_SE * noise / math.sqrt(len(block))
            if block_median > anchor + self._log_thr + o.z * se:
                return {
                    "rule": "changepoint",
                    "test": "drift",
                    "ratio": math.exp(block_median - anchor),
                    "baseline_ms": math.exp(anchor) / 1e6,
                    "recent_ms": math.exp(block_median) / 1e6,
                    "noise": noise,
                }
        return None

    def observe(self, duration_ns: int) -> dict[str, object] | None:
        x = math.log(duration_ns) if duration_ns > 0 else 0.0
        recent = self._recent
        n = len(recent)
        sums = self._sums
        for j, k in enumerate(self._windows):
            sums[j] += x - recent[-k] if n >= k else x
        if n == self._kmax:
            self._ref.append(recent[0])
        recent.append(x)
        if len(self._ref) < self.options.min_ref_iters:
            if not self._noise_floor:
                return None  # warming up
            self._refresh(drift=False)  # rebased: a small reference, refreshed every iteration
        else:
            self._noise_floor = 0.0
            self._since_block += 1
            if not self._bounds or self._since_block >= self.options.block_iters:
                self._since_block = 0
                self._resum()
                detail = self._refresh()
                if detail is not None:
                    self._rebase(list(recent))
                    return detail
        n = len(recent)
        for j, k in enumerate(self._windows):
            # the trimmed mean never exceeds the plain mean: test the cheap one first
            if sums[j] <= self._bounds[j] * k or k > n:
                continue
            window = [recent[i] for i in range(n - k, n)]
            trimmed = (sums[j] - max(window)) / (k - 1)
            if trimmed > self._bounds[j]:
                detail = {
                    "rule": "changepoint",
                    "test": f"window{k}",
                    "ratio": math.exp(trimmed - self._level),
                    "baseline_ms": math.exp(self._level) / 1e6,
                    "recent_ms": math.exp(trimmed) / 1e6,
                    "noise": self._noise,
                }
                self._rebase(window)
                return detail
        return None

    def _resum(self) -> None:
        """Recompute the running window sums exactly (bounds floating-point drift)."""
        recent = list(self._recent)
        self._sums = [sum(recent[-k:]) for k in self._windows]


def make_rule(mode: str, threshold: float, window_iters: int, z: float, ref_iters: int) -> SlowdownRule:
    if mode == "paper":
        return PaperRule(PaperOptions(window_iters=window_iters, threshold=threshold))
    if mode == "changepoint":
        return ChangepointRule(ChangepointOptions(threshold=threshold, z=z, ref_iters=ref_iters))
    from perftracker.errors import ConfigError

    raise ConfigError(f"PERFTRACKER_DETECTOR_MODE={mode!r}: expected 'paper' or 'changepoint'")
