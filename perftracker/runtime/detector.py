"""The iteration detector (docs/design.md section 3). Pure: a clock is injected and it does no I/O.

Input: hook events ``(kind, t_ns)`` where kind is ``DATALOADER`` (a DataLoader iterator's
``__next__`` was entered) or ``STEP`` (an ``Optimizer.step`` returned).

- **Learning.** The event stream is cut into segments at every STEP -> DATALOADER transition, so
  each segment reads ``D..D O..O``. When the last N segments are identical (or, for iterations
  made of 2 or 3 different segments such as ``D O O | D O``, the last N groups), that group
  becomes the *iteration sequence*. A stream with no DataLoader at all learns ``O``.
- **Tracking.** Each event is matched against the sequence; the event that completes it is an
  *iteration boundary*. Iteration duration = time between consecutive boundaries, so it covers
  everything the loop does (zero_grad, logging, a checkpoint save). Iterations during which an
  event did not match are counted but not fed to the slowdown rule.
- **Re-detection.** M consecutive unmatched events (no boundary in between) send the detector back
  to learning. History survives if the same sequence is learned again.
- **Slowdown.** Each clean iteration duration goes to a ``SlowdownRule`` (``perftracker.runtime.slowdown``).
- **Own perturbation.** While a profile window runs and is written, and for a settle after it
  (``settle_iters`` iterations and ``window_s``; see ``set_profiling``), a detection may be
  perftracker's own doing (profiler overhead, its stop, the writer), the slowdown the window is
  profiling, or one that began meanwhile. A slowdown that began before the window's middle was
  profiled: dropped. A later one is held, and passed on after the settle only if the job is still
  slower than the detection's baseline by at least half the detected excess.
- **Post-window check.** After the settle that follows a window this rank's trigger opened, the
  job is compared once more with the level before that trigger. Still slower: a ``post-window``
  trigger (through the gate). The window's own iterations carry the profiler's overhead, which
  can hide a fault of the same size that begins right after it; this check does not depend on
  them. It also means a sustained slowdown is profiled twice: once at its onset, once to confirm.
- **Trigger gate.** Detections become triggers through a token bucket
  (``perftracker.runtime.trigger.gate``).
- **Blocked.** ``check_blocked(now_ns)``: idle since the last event >= max(blocked_factor x mean
  iteration, blocked_min_s). It only reads attributes, so another thread may call it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from perftracker.clock import Clock, MonotonicClock
from perftracker.config import Config
from perftracker.runtime.slowdown import SlowdownRule, make_rule
from perftracker.runtime.trigger.defer import slow_levels, still_slow
from perftracker.runtime.trigger.gate import ADMIT, TriggerGate

DATALOADER = 0
STEP = 1
POST_WINDOW = "post-window"  # the test name of a post-window check's trigger
_MEDIAN_SE = 1.2533  # standard error of a median, in units of sigma / sqrt(n), for a normal
KIND_NAMES = ("dataloader.next", "optimizer.step")
MAX_PERIOD_SEGMENTS = 3
MAX_SEGMENT_EVENTS = 4096


@dataclass(frozen=True)
class DetectorOptions:
    mode: str = "changepoint"
    learn_sequences: int = 10  # N
    slowdown_window_iters: int = 50  # W
    slowdown_threshold: float = 0.05
    redetect_events: int = 200  # M
    blocked_factor: float = 5.0
    blocked_min_s: float = 5.0
    trigger_cooldown_s: float = 120.0
    trigger_burst: int = 2
    trigger_min_gap_s: float = 20.0  # the profile window's length: detections inside it are absorbed
    changepoint_z: float = 5.0
    changepoint_ref_iters: int = 300
    settle_iters: int = 15  # after a window is written: iterations (and window_s) before detections count
    batch_ms: float = 20.0  # iterations shorter than this reach the slowdown rule in batches of this span
    batch_max: int = 64  # ... of at most this many iterations

    @classmethod
    def from_config(cls, config: Config) -> DetectorOptions:
        return cls(
            mode=config.detector_mode,
            learn_sequences=config.learn_sequences,
            slowdown_window_iters=config.slowdown_window_iters,
            slowdown_threshold=config.slowdown_threshold,
            redetect_events=config.redetect_events,
            blocked_factor=config.blocked_factor,
            blocked_min_s=config.blocked_min_s,
            trigger_cooldown_s=config.trigger_cooldown_s,
            trigger_burst=config.trigger_burst,
            trigger_min_gap_s=config.window_s,
            changepoint_z=config.changepoint_z,
            changepoint_ref_iters=config.changepoint_ref_iters,
        )


class Detector:
    """Learns the iteration sequence from hook events and watches for slowdowns and blocks."""

    def __init__(self, options: DetectorOptions | None = None, clock: Clock | None = None) -> None:
        o = self.options = options or DetectorOptions()
        self.clock = clock or MonotonicClock()
        self.rule: SlowdownRule = make_rule(
            o.mode, o.slowdown_threshold, o.slowdown_window_iters, o.changepoint_z, o.changepoint_ref_iters
        )
        self.phase = "learning"
        self.sequence: tuple[int, ...] = ()
        self.iteration = 0  # completed iterations (before learning: every STEP is one)
        self.learned_at_iteration = -1
        self.relearn_count = 0
        self.last_kind = -1
        self.last_t_ns = -1
        self.last_boundary_ns = -1
        self.first_t_ns = -1  # the first hook event: when training began (the window budget accrues from it)
        self._w = max(o.slowdown_window_iters, 1)
        self.durations_ns: deque[int] = deque(maxlen=self._w)
        self._durations_sum = 0
        self._observe = self.rule.observe
        # completed iterations not yet fed to the rule: +duration (to observe) or -duration (record only)
        self._batch: list[int] = []
        self._batch_ns = int(o.batch_ms * 1e6)
        self._batch_max = max(o.batch_max, 1)
        self._drained_ns = -(1 << 62)  # the boundary at which the batch was last drained
        self.gate = TriggerGate(o.trigger_cooldown_s, o.trigger_burst, o.trigger_min_gap_s)
        self.pending: dict[str, object] | None = None  # a slowdown trigger waiting to be collected
        self.suppressed: dict[str, int] = {}  # detections the gate did not pass, by verdict
        self._profiling = False  # a profile window is armed, running or being written
        self._settle_left = 0  # iterations left in the settle after a window
        self._settle_until_ns = 0  # ... and it lasts until this event time at least
        self._held: dict[str, object] | None = None  # a detection made while profiling or settling
        self._profiled_until = 0  # slowdowns that began before this iteration were profiled (window middle)
        self._window_s = o.trigger_min_gap_s  # the latest window's length
        # the post-window check: (trigger time ns, baseline ms, noise) of this rank's last trigger,
        # then attached to the window it opened, checked at the end of that window's settle
        self._confirm: tuple[int, float, float] | None = None
        self._confirm_window: tuple[int, float, float] | None = None
        self._settled = 0  # iterations seen since the window was written
        # learning state
        self._cur: list[int] = []
        self._segments: deque[tuple[int, ...]] = deque(maxlen=o.learn_sequences * MAX_PERIOD_SEGMENTS)
        self._saw_dataloader = False
        # tracking state
        self._pos = 0
        self._unmatched = 0
        self._dirty = False

    # ----------------------------------------------------------------------------------------
    # the hot path
    # ----------------------------------------------------------------------------------------
    def on_event(self, kind: int, t_ns: int) -> bool:
        """Feed one hook event; True when it completes an iteration (an iteration boundary)."""
        self.last_kind = kind
        self.last_t_ns = t_ns
        if self.phase == "tracking":
            pos = self._pos
            seq = self.sequence
            if kind == seq[pos]:
                pos += 1
                if pos == len(seq):
                    # _complete inlined: this runs once per iteration between long stretches of torch
                    # work, with cold caches; every call and attribute counts (docs/overhead.md)
                    self._pos = 0
                    self.iteration += 1
                    last = self.last_boundary_ns
                    self.last_boundary_ns = t_ns
                    if self._unmatched or self._dirty:
                        self._unmatched = 0
                        self._dirty = False
                        if last >= 0:
                            self._batch.append(last - t_ns)  # recorded, not observed
                    elif last >= 0:
                        self._batch.append(t_ns - last)
                    if t_ns - self._drained_ns >= self._batch_ns or len(self._batch) >= self._batch_max:
                        self._drain()
                    return True
                self._pos = pos
                return False
            self._mismatch(kind)
            return False
        return self._learn(kind, t_ns)

    def feed(self, events: list[int]) -> bool:
        """Feed logged hook events ``(t_ns << 1) | kind`` in order, as ``on_event`` would one by one;
        True when the last one completed an iteration (an iteration boundary).

        The tracking fast path matches the sequence with local variables only and queues the
        durations for one drain at the end; anything else (learning, a mismatch) goes through
        ``on_event`` from there on.
        """
        if not events:
            return False
        if self.phase != "tracking":
            boundary = False
            for e in events:
                boundary = self.on_event(e & 1, e >> 1)
            return boundary
        seq, pos, n_seq = self.sequence, self._pos, len(self.sequence)
        last, iteration, dirty, unmatched = self.last_boundary_ns, self.iteration, self._dirty, self._unmatched
        append = self._batch.append
        boundary = False
        for i, e in enumerate(events):
            kind = e & 1
            if kind != seq[pos]:  # a mismatch: hand over to the full path
                self._pos, self.last_boundary_ns, self.iteration = pos, last, iteration
                self._dirty, self._unmatched = dirty, unmatched
                for rest in events[i:]:
                    boundary = self.on_event(rest & 1, rest >> 1)
                return boundary
            pos += 1
            if pos == n_seq:
                pos = 0
                iteration += 1
                t_ns = e >> 1
                if last >= 0:
                    # an iteration with an unmatched event is recorded, not observed (negative)
                    append(last - t_ns if dirty or unmatched else t_ns - last)
                dirty, unmatched = False, 0
                last = t_ns
                boundary = True
            else:
                boundary = False
        self._pos, self.last_boundary_ns, self.iteration = pos, last, iteration
        self._dirty, self._unmatched = dirty, unmatched
        e = events[-1]
        self.last_kind, self.last_t_ns = e & 1, e >> 1
        if last - self._drained_ns >= self._batch_ns or len(self._batch) >= self._batch_max:
            self._drain()
        return boundary

    def _complete(self, t_ns: int) -> None:
        """An iteration boundary: count it, and queue its duration for the rule (see _drain)."""
        self.iteration += 1
        last = self.last_boundary_ns
        self.last_boundary_ns = t_ns
        if last < 0:
            return
        if self._dirty or self.phase != "tracking":
            self._dirty = False
            self._batch.append(last - t_ns)  # recorded, not observed
        else:
            self._batch.append(t_ns - last)
        if t_ns - self._drained_ns >= self._batch_ns or len(self._batch) >= self._batch_max:
            self._drain()

    def _drain(self) -> None:
        """Feed the queued iterations to the rule, in order, as if each had been fed at its boundary.

        **[decision]** Iterations shorter than ``batch_ms`` are fed in batches spanning at least
        ``batch_ms`` (at most ``batch_max`` iterations). Fed one at a time between 1 ms of torch
        work, the rule ran with cold caches and cost 7-15 µs per iteration, ten times its cost when
        warm (docs/overhead.md); in a batch it runs warm. A detection comes at most ``batch_ms``
        later in wall time; its iteration number is the one where the rule fired.
        """
        batch = self._batch
        if not batch:
            self._drained_ns = self.last_boundary_ns
            return
        self._batch = []
        self._drained_ns = self.last_boundary_ns
        it = self.iteration - len(batch)
        t_ns = self.last_boundary_ns - sum(map(abs, batch))  # the boundary before the batch's first
        durations, w, observe = self.durations_ns, self._w, self._observe
        if not self._profiling and self._settle_left <= 0:
            # the common case: no window, no settle; nothing below reads the durations window, so it
            # is updated once for the whole batch (the same contents and sum)
            durations.extend(map(abs, batch))
            self._durations_sum = sum(durations)
            for d in batch:
                it += 1
                if d > 0:
                    t_ns += d
                    detail = observe(d)
                    if detail is not None:
                        self._pass(detail, t_ns, it)
                else:
                    t_ns -= d
            return
        for d in batch:
            it += 1
            clean = d > 0
            if not clean:
                d = -d
            t_ns += d
            if len(durations) == w:
                self._durations_sum += d - durations[0]
            else:
                self._durations_sum += d
            durations.append(d)
            if not clean:
                continue
            detail = observe(d)
            if self._profiling or self._settle_left > 0:
                self._hold(detail, t_ns, it)
            elif detail is not None:
                self._pass(detail, t_ns, it)

    def _pass(self, detail: dict[str, object], t_ns: int, iteration: int) -> None:
        verdict = self.gate.admit(t_ns)
        if verdict != ADMIT:
            self.suppressed[verdict] = self.suppressed.get(verdict, 0) + 1
            return
        detail["iteration"] = iteration
        detail["mode"] = self.options.mode
        self.pending = detail
        base = detail.get("baseline_ms", detail.get("shortest_ms"))
        noise = detail.get("noise", 0.0)
        if detail.get("test") != POST_WINDOW and isinstance(base, (int, float)) and base > 0:
            self._confirm = (t_ns, float(base), float(noise) if isinstance(noise, (int, float)) else 0.0)
        else:
            self._confirm = None

    def trigger_sent_late(self, t_ns: int) -> None:
        """A trigger held until worth a window (perftracker/runtime/trigger/defer.py) goes out now
        (channel thread): its window's post-window check counts from now, not from the detection."""
        c = self._confirm
        if c is not None:
            self._confirm = (int(t_ns), c[1], c[2])

    # ----------------------------------------------------------------------------------------
    # profile windows: perftracker's own perturbation
    # ----------------------------------------------------------------------------------------
    def set_profiling(self, active: bool, window_s: float | None = None) -> None:
        """A profile window of ``window_s`` (default: the configured one) is armed (True), or written
        and gone (False). Any thread."""
        if window_s is not None and window_s > 0:
            self._window_s = float(window_s)
        if active:
            if not self._profiling:
                mean_ns = self.mean_iteration_ns
                window_iters = self._window_s * 1e9 / mean_ns if mean_ns > 0 else 0.0
                self._profiled_until = self.iteration + int(window_iters / 2)
                confirm, self._confirm = self._confirm, None
                # this rank's trigger opened this window if it came just before it
                fresh = confirm is not None and self.last_t_ns - confirm[0] < self._window_s * 1e9
                self._confirm_window = confirm if fresh else None
            self._profiling = True
            self._settle_left = 0
        else:
            self._settled = 0
            self._settle_left = max(self.options.settle_iters, 1)
            # as long again as the window: the other ranks' windows end and are written a little
            # later, and in a synchronous job their cost is this rank's too (seen in the fault bench)
            self._settle_until_ns = max(self.last_t_ns, 0) + int(self._window_s * 1e9)
            self._profiling = False

    def _hold(self, detail: dict[str, object] | None, t_ns: int, iteration: int) -> None:
        if detail is not None:
            runs = detail.get("iterations")
            began = iteration - (runs if isinstance(runs, int) else 0)
            if began < self._profiled_until:  # the window saw at least half of it
                self.suppressed["profiled"] = self.suppressed.get("profiled", 0) + 1
            elif self._held is None:
                detail["held_from_iteration"] = iteration  # the first: its baseline is the lowest
                detail["began_iteration"] = began
                self._held = detail
        if self._profiling:
            return
        self._settled += 1
        self._settle_left -= 1
        if self._settle_left > 0:
            return
        if t_ns < self._settle_until_ns:
            self._settle_left = 1
            return
        held, self._held = self._held, None
        confirm, self._confirm_window = self._confirm_window, None
        if held is not None:
            if self._still_slow(held):
                self._pass(held, t_ns, iteration)
                return
            self.suppressed["profiling"] = self.suppressed.get("profiling", 0) + 1
        if confirm is not None:
            detail = self._post_window(confirm[1], confirm[2])
            if detail is not None:
                self._pass(detail, t_ns, iteration)

    def _post_window(self, base_ms: float, noise: float) -> dict[str, object] | None:
        """The post-window check: the median of the iterations since the window was written (up to
        W) against the level before the trigger, by more than the threshold and three standard
        errors of that median. A detail mapping if still slower, else None."""
        n = min(self._settled, len(self.durations_ns))
        if n < 5:
            return None
        median_ms = self._recent_median_ms(n)
        bound = max(math.log1p(self.options.slowdown_threshold), 3 * _MEDIAN_SE * noise / math.sqrt(n))
        if median_ms <= 0 or math.log(median_ms / base_ms) <= bound:
            return None
        return {"rule": self.options.mode, "test": POST_WINDOW, "ratio": median_ms / base_ms, "baseline_ms": base_ms,
                "recent_ms": median_ms, "noise": noise, "iterations": n}

    def _still_slow(self, detail: dict[str, object]) -> bool:
        """The median of the last settle iterations is above the midpoint (in log time) between the
        detection's baseline and its slow level: the slowdown outlived the window."""
        levels = slow_levels(detail)
        if levels is None:
            return False
        return still_slow(self._recent_median_ms(min(self.options.settle_iters, 9)), *levels)

    def _recent_median_ms(self, n: int) -> float:
        """Median of the last ``n`` iteration durations (fewer if fewer are kept), in ms; 0 if none."""
        recent = sorted(list(self.durations_ns)[-n:]) if n > 0 else []
        return recent[len(recent) // 2] / 1e6 if recent else 0.0

    @property
    def mean_iteration_ns(self) -> float:
        """Mean of the last W iteration durations; 0 while unknown. Safe from any thread."""
        n = len(self.durations_ns)
        return self._durations_sum / n if n else 0.0

    def _mismatch(self, kind: int) -> None:
        self._unmatched += 1
        self._dirty = True
        if self._unmatched >= self.options.redetect_events:
            self._relearn()
            return
        seq = self.sequence
        if kind == seq[0]:
            self._pos = 1
        else:
            self._pos = 0

    # ----------------------------------------------------------------------------------------
    # learning
    # ----------------------------------------------------------------------------------------
    def _learn(self, kind: int, t_ns: int) -> bool:
        if self.first_t_ns < 0:
            self.first_t_ns = t_ns
        cur = self._cur
        if kind == DATALOADER:
            self._saw_dataloader = True
            if cur and cur[-1] == STEP:
                self._segments.append(tuple(cur))
                cur.clear()
                cur.append(DATALOADER)
                if self._try_learn():
                    return False
            else:
                cur.append(DATALOADER)
                if len(cur) > MAX_SEGMENT_EVENTS:
                    cur.clear()
            return False
        # STEP: before learning, every optimizer step is an iteration boundary
        if not self._saw_dataloader:
            self._segments.append((STEP,))
            self._try_learn()
        else:
            cur.append(STEP)
            if len(cur) > MAX_SEGMENT_EVENTS:
                cur.clear()
        self._complete(t_ns)
        return True

    def _try_learn(self) -> bool:
        segs = self._segments
        n = self.options.learn_sequences
        for period in range(1, MAX_PERIOD_SEGMENTS + 1):
            need = n * period
            if len(segs) < need:
                break
            tail = list(segs)[-need:]
            if all(tail[i] == tail[i + period] for i in range(need - period)):
                if period > 1 and all(seg == tail[-1] for seg in tail[-period:]):
                    continue  # a shorter period already describes it
                sequence = tuple(k for seg in tail[-period:] for k in seg)
                self._start_tracking(sequence)
                return True
        return False

    def _start_tracking(self, sequence: tuple[int, ...]) -> None:
        self._drain()
        if self.sequence and sequence != self.sequence:
            self.rule.reset()
        self.sequence = sequence
        self.phase = "tracking"
        self.learned_at_iteration = self.iteration
        self._segments.clear()
        # the event that closed the last segment (a DATALOADER, or a STEP for the "O" sequence)
        if sequence == (STEP,):
            self._pos = 0
        else:
            self._pos = 1
        self._cur = []
        self._unmatched = 0
        self._dirty = False

    def _relearn(self) -> None:
        self._drain()
        self.phase = "learning"
        self.relearn_count += 1
        self._cur = [self.last_kind]
        self._segments.clear()
        self._pos = 0
        self._unmatched = 0
        self._dirty = True

    # ----------------------------------------------------------------------------------------
    # queries (any thread)
    # ----------------------------------------------------------------------------------------
    def pop_trigger(self) -> dict[str, object] | None:
        detail, self.pending = self.pending, None
        return detail

    def blocked_limit_ns(self) -> float:
        """Idle time after which the job counts as blocked; inf while the mean is unknown."""
        mean = self.mean_iteration_ns
        if mean <= 0:
            return float("inf")
        return max(self.options.blocked_factor * mean, self.options.blocked_min_s * 1e9)

    def check_blocked(self, now_ns: int | None = None, extra_s: float = 0.0) -> dict[str, object] | None:
        """A detail mapping if no event came for the blocked limit (plus ``extra_s``), else None.
        Thread-safe reads."""
        last_t_ns = self.last_t_ns
        if last_t_ns < 0:
            return None
        now = self.clock.now_ns() if now_ns is None else now_ns
        limit_ns = self.blocked_limit_ns() + max(extra_s, 0.0) * 1e9
        idle_ns = now - last_t_ns
        if idle_ns < limit_ns:
            return None
        return {
            "idle_s": idle_ns / 1e9,
            "limit_s": limit_ns / 1e9,
            "mean_iteration_ms": self.mean_iteration_ns / 1e6,
            "last_event": KIND_NAMES[self.last_kind] if self.last_kind >= 0 else "",
            "last_event_ns": last_t_ns,
            "iteration": self.iteration,
            "phase": self.phase,
        }

    def boundaries_in(self, kinds: list[int]) -> int:
        """How many iteration boundaries these events (not fed yet) would complete; reads only, so
        another thread may call it (Runtime.iteration from a heartbeat or a hang snapshot)."""
        seq, pos = self.sequence, self._pos
        if self.phase != "tracking" or not seq:
            return sum(1 for k in kinds if k == STEP)  # before learning every step counts
        n = 0
        for k in kinds:
            if k == seq[pos]:
                pos += 1
                if pos == len(seq):
                    pos, n = 0, n + 1
            else:
                pos = 1 if k == seq[0] else 0
        return n

    def sequence_names(self) -> list[str]:
        return [KIND_NAMES[k] for k in self.sequence]
