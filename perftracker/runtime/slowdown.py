"""Slowdown rules over a stream of iteration durations (docs/design.md section 3). Pure: no clock, no I/O.

Two rules share one small interface (``observe(duration_ns) -> detail | None`` and ``reset()``):

- ``PaperRule``: the PerfTracker paper's rule. The mean of the last W iterations exceeds the
  recent shortest iteration by more than ``threshold``. **[decision]** "recent shortest" is the
  minimum over the same last W iterations, so the rule forgets a level once it has left the window.
- ``ChangepointRule``: robust change-point detection on log iteration times. A rolling reference
  (median and interquartile range of the iterations just before the test windows) gives the level
  and the noise;
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
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass
from operator import mul
from typing import Protocol

_log = math.log
_IQR_TO_SIGMA = 1.349  # interquartile range of a normal, in sigmas
_MEDIAN_SE = 1.2533  # standard error of a median, in units of sigma / sqrt(n), for a normal
_MIN_CUSUM_RUN = 4  # a shorter CUSUM run is a burst of spikes (3 in a row seen at a 1% spike rate)


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
                "iterations": self._w,
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
    block_iters: int = 100  # reference statistics are refreshed every block
    anchor_blocks: int = 20  # drift anchor: lowest block median over this many blocks
    min_noise: float = 0.002  # floor on the relative noise (perfectly regular series)
    # CUSUM over a grid of change sizes (relative slowdowns; the smallest is the threshold). Each
    # is Page's CUSUM of the log-likelihood ratio for that size; the grid fires when one of them
    # exceeds cusum_llr. Spacing x2: a size between two grid points loses at most ~9% of the
    # information rate (docs/detection.md)
    cusum_sizes: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4, 0.8)
    cusum_llr: float = 10.0  # decision threshold on the log-likelihood ratio (Gaussian: ~0.6 false per 10k)
    cusum_h: float = 12.0  # legacy knob: any value >= 1e6 turns the CUSUM off (tests)
    cusum_clip: float = 3.0  # standardized values are winsorized at +-this: one step adds at most clip²/2 = 4.5


class ChangepointRule:
    """Multi-window robust level-shift test on log durations, plus a drift test against an anchor.

    Hot path per iteration: one log, two list appends and one subtraction and comparison per
    window (window sums come from a running prefix sum). The reference statistics (one sort)
    are refreshed once per block.
    """

    def __init__(self, options: ChangepointOptions | None = None) -> None:
        o = self.options = options or ChangepointOptions()
        self._windows = tuple(sorted(o.windows))
        self._kmax = self._windows[-1]
        self._log_thr = math.log1p(o.threshold)
        self.reset()

    def reset(self) -> None:
        self._xs: list[float] = []  # log durations (trimmed to the last ref_iters + kmax + block)
        self._cum: list[float] = [0.0]  # prefix sums: sum(xs[a:b]) == cum[b] - cum[a]
        self._ref_lo = 0  # the reference starts here in xs
        self._test_lo = 0  # test windows use xs[test_lo:] only
        self._anchors: deque[float] = deque(maxlen=self.options.anchor_blocks)
        self._countdown = 1  # iterations until _maintain runs
        self._level = math.nan  # reference median (log ns)
        self._noise = math.nan  # reference robust sigma (log units)
        self._noise_floor = 0.0  # after a rebase: the noise seen before it (stay conservative)
        self._tests: tuple[tuple[int, float], ...] = ()  # (k, k * bound)
        # the CUSUM grid: per size, (llr gain per standardized unit, its drift) and the running sums
        self._cusum_on = False  # off until the reference holds a whole block
        self._cusum_mu = 0.0  # mean of the winsorized standardized reference (skew correction)
        self._cusum_scale = 1.0  # ... and its standard deviation (heavy tails)
        self._cusum_grid: tuple[tuple[float, float, float], ...] = ()  # (a, b, size): step = a * z - b
        self._cusum_s: list[float] = []  # one sum per grid size
        self._cusum_from: list[int] = []  # where each sum's current run began (the change point)
        self._cusum_peak: list[float] = []  # the largest value in each sum's current run

    def _reference(self) -> list[float]:
        n = len(self._xs)
        hi = n - self._kmax
        # a CUSUM run that has gathered half the evidence it needs may be a change in
        # progress: keep it out of the reference, or a slow onset becomes the new normal before
        # the sum gets there
        for s, start in zip(self._cusum_s, self._cusum_from, strict=True):
            if s > 0.5 * self.options.cusum_llr:
                hi = min(hi, start)
        hi = max(self._test_lo, hi)
        lo = max(self._ref_lo, hi - self.options.ref_iters)
        return self._xs[lo:hi]

    def _rebase(self, k: int) -> None:
        """After firing: the k values that fired (the new level) become the whole reference.

        Tests resume on the values that follow, as soon as the shortest window refills, with the
        earlier noise as a floor: a transient burst blinds the rule for a few iterations only, and
        a sustained slowdown fires once.
        """
        n = len(self._xs)
        noise = self._noise
        self._ref_lo, self._test_lo = n - k, n
        self._cusum_on, self._cusum_s, self._cusum_from, self._cusum_peak = False, [], [], []
        self._anchors.clear()
        self._countdown = 1
        self._noise_floor = noise if noise == noise else 0.0
        self._refresh(drift=False)

    def _trim(self) -> None:
        keep = self.options.ref_iters + self._kmax
        cut = min(len(self._xs) - keep, self._ref_lo, self._test_lo)
        if cut <= 0:
            return
        del self._xs[:cut]
        base = self._cum[cut]
        self._cum = [c - base for c in self._cum[cut:]]
        self._ref_lo -= cut
        self._test_lo -= cut
        self._cusum_from = [max(f - cut, 0) for f in self._cusum_from]

    def _refresh(self, drift: bool = True) -> dict[str, object] | None:
        """Recompute level, noise and window bounds; update the drift anchor and test the drift."""
        o = self.options
        raw = self._reference()
        ref = sorted(raw)  # the one sort per block: level and spread both come from it
        n = len(ref)
        if n == 0:
            self._tests, self._cusum_on = (), False
            return None
        mid = n // 2
        level = ref[mid] if n % 2 else 0.5 * (ref[mid - 1] + ref[mid])
        iqr = ref[(3 * (n - 1)) // 4] - ref[(n - 1) // 4]
        noise = max(iqr / _IQR_TO_SIGMA, o.min_noise, self._noise_floor)
        self._level, self._noise = level, noise
        self._tests = tuple(
            (k, k * (level + max(self._log_thr, o.z * noise / math.sqrt(k - 1)))) for k in self._windows
        )
        # The CUSUM is the more sensitive test, so it waits for a reference of a whole block: noise
        # from the first 30 iterations can be half the real one (seen in tests/unit/test_detector.py)
        if n >= o.block_iters and o.cusum_h < 1e6:
            self._set_cusum(ref, level, noise)
        else:
            self._cusum_on = False
        if not drift:
            return None
        # drift: the median of the latest block against the lowest block median seen recently
        block = sorted(raw[-o.block_iters :])
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
                    "iterations": len(block),
                }
        return None

    def _maintain(self) -> dict[str, object] | None:
        """Warm-up, the growing reference after a rebase, and the per-block refresh + drift test."""
        o = self.options
        n = len(self._xs)
        self._countdown = 1
        if self._noise_floor:  # rebased: refresh the small reference every 5 new values
            grown = n - self._kmax - self._test_lo
            if grown < o.min_ref_iters:
                if grown > 0 and grown % 5 == 0:
                    self._refresh(drift=False)
                return None
            self._noise_floor = 0.0
        if n - self._kmax - self._ref_lo < o.min_ref_iters:
            self._tests, self._cusum_on = (), False  # warming up
            return None
        self._countdown = o.block_iters
        self._trim()
        detail = self._refresh()
        if detail is not None:
            self._rebase(min(self._kmax, len(self._xs) - self._test_lo))
        return detail

    def observe(self, duration_ns: int) -> dict[str, object] | None:
        xs = self._xs
        cum = self._cum
        x = _log(duration_ns) if duration_ns > 0 else 0.0
        xs.append(x)
        cum.append(cum[-1] + x)
        self._countdown -= 1
        if self._countdown <= 0:  # once per block, or every iteration while warming up / rebased
            detail = self._maintain()
            if detail is not None:
                return detail
            cum = self._cum
        n = len(xs)
        avail = n - self._test_lo
        top = cum[n]
        if self._cusum_on:
            detail = self._cusum_step(x, n)
            if detail is not None:
                return detail
        for k, bound_k in self._tests:
            # the trimmed mean never exceeds the plain mean: test the cheap one first
            if k > avail or top - cum[n - k] <= bound_k:
                continue
            window = xs[n - k :]
            trimmed = (top - cum[n - k] - max(window)) / (k - 1)
            if trimmed > bound_k / k:
                detail = {
                    "rule": "changepoint",
                    "test": f"window{k}",
                    "ratio": math.exp(trimmed - self._level),
                    "baseline_ms": math.exp(self._level) / 1e6,
                    "recent_ms": math.exp(trimmed) / 1e6,
                    "noise": self._noise,
                    "iterations": k,
                }
                self._rebase(k)
                return detail
        return None

    def _set_cusum(self, ref: list[float], level: float, noise: float) -> None:
        """The CUSUM grid's calibration from the (sorted) reference: standardized values are
        winsorized at +-clip, then centred and scaled by the reference's own mean and standard
        deviation of them, so that real iteration times (right-skewed, heavier tails than a normal)
        give each sum a negative drift before a change. Running sums carry over (a refresh is not a
        change). C-level sums over the sorted reference: once per block."""
        n = len(ref)
        c = self.options.cusum_clip
        lo_b, hi_b = level - c * noise, level + c * noise
        i, j = bisect_left(ref, lo_b), bisect_right(ref, hi_b)
        mid = ref[i:j]
        total = i * lo_b + sum(mid) + (n - j) * hi_b
        squares = i * lo_b * lo_b + sum(map(mul, mid, mid)) + (n - j) * hi_b * hi_b
        mean = total / n
        var = max(squares / n - mean * mean, 0.0) * n / max(n - 1, 1)
        scale = math.sqrt(var) / noise if var > 0 else 1.0
        self._cusum_mu, self._cusum_scale = (mean - level) / noise, scale
        grid = []
        for size in self.options.cusum_sizes:
            if size < self.options.threshold:
                continue
            d = math.log1p(size) / (noise * scale)  # the size in standardized units
            grid.append((d, d * d / 2, size))
        self._cusum_grid = tuple(grid)
        if len(self._cusum_s) != len(grid):
            m = len(self._xs)
            self._cusum_s, self._cusum_from = [0.0] * len(grid), [m] * len(grid)
            self._cusum_peak = [-math.inf] * len(grid)
        self._cusum_on = bool(grid)

    def _cusum_step(self, x: float, n: int) -> dict[str, object] | None:
        """One step of Page's CUSUM for every size of the grid (a GLR over the sizes, O(sizes)).

        The window tests need a shift of z noise errors within one window; CUSUM adds up the
        evidence as it comes and is the shortest-delay test for a sustained shift of a known size at
        a given false-alarm rate. The size is not known, so one sum runs per size of a geometric
        grid: the grid fires when any sum's log-likelihood ratio exceeds ``cusum_llr``. It also
        catches faults that slow only some iterations (a CPU quota: every second iteration waits out
        the throttle period), where a trimmed window mean stays noisy. Winsorizing keeps one spike
        (a checkpoint) from firing it alone.
        """
        c = self.options.cusum_clip
        z = (x - self._level) / self._noise
        if z > c:
            z = c
        elif z < -c:
            z = -c
        z = (z - self._cusum_mu) / self._cusum_scale
        sums, starts, peaks, llr = self._cusum_s, self._cusum_from, self._cusum_peak, self.options.cusum_llr
        fired = -1
        i = 0
        for a, b, _ in self._cusum_grid:
            prev = sums[i]
            s = prev + a * z - b
            if s <= 0.0:
                if prev:
                    sums[i] = 0.0
            else:
                sums[i] = s
                if not prev:  # a run begins with this value
                    starts[i], peaks[i] = n - 1, x
                elif x > peaks[i]:
                    peaks[i] = x
                if s > llr and fired < 0:
                    fired = i
            i += 1
        if fired < 0:
            return None
        k = max(n - starts[fired], 1)
        total = self._cum[n] - self._cum[n - k]  # O(1): the prefix sums
        mean = total / k
        if mean - self._level < self._log_thr:
            # evidence, but the run is not slower than the threshold (yet): hold the sum at the edge
            sums[fired] = self.options.cusum_llr
            return None
        if k < _MIN_CUSUM_RUN:
            return None  # a burst of spikes (a few checkpoint-like iterations), not a new level (yet)
        if (total - peaks[fired]) / (k - 1) - self._level < self._log_thr:
            sums[fired] = self.options.cusum_llr
            return None  # its slowness is one spike (a checkpoint-like iteration inside the run)
        detail: dict[str, object] = {
            "rule": "changepoint",
            "test": "cusum",
            "ratio": math.exp(mean - self._level),
            "baseline_ms": math.exp(self._level) / 1e6,
            "recent_ms": math.exp(mean) / 1e6,
            "noise": self._noise,
            "iterations": k,
            "size": self._cusum_grid[fired][2],
        }
        self._rebase(min(k, self._kmax))
        return detail


def make_rule(mode: str, threshold: float, window_iters: int, z: float, ref_iters: int) -> SlowdownRule:
    if mode == "paper":
        return PaperRule(PaperOptions(window_iters=window_iters, threshold=threshold))
    if mode == "changepoint":
        return ChangepointRule(ChangepointOptions(threshold=threshold, z=z, ref_iters=ref_iters))
    from perftracker.errors import ConfigError

    raise ConfigError(f"PERFTRACKER_DETECTOR_MODE={mode!r}: expected 'paper' or 'changepoint'")
