"""Per-step phase times from the hooks (issue 30, the first look): how long each optimizer step of
this process spent in data loading, in the optimizer step, and in the rest (forward, backward and
waiting in collectives), measured by the hooks that run anyway, with no profiler.

The hooks give three instants per step: a DataLoader ``__next__`` entered and returned (the data
wait: the time the training thread spent inside ``__next__``, summed over the batches fetched
since the previous step), the optimizer step's pre-hook and its post-hook. One row per optimizer
step, from one post-hook to the next:

- ``data_ms``: time inside ``DataLoader.__next__`` since the previous step returned;
- ``step_ms``: the optimizer step (pre-hook to post-hook);
- ``rest_ms``: the remainder (forward, backward, waits in collectives, logging, zero_grad).

A loop with two optimizer steps per iteration gives two rows per iteration (each with its own
share); a loop without a DataLoader has ``data_ms`` 0.

**[decision] Rows are made by the reader, not the training thread (issue 45).** The hooks only log
the four instants, ``(t_ns << 2) | code`` (codes in perftracker/runtime/hooks.py); the runtime hands
its log to ``feed`` when it feeds the detector (every 20 ms at most), which extends a ring of raw
events in one C call. The rows are computed from that ring when they are read (``recent_ms``: the
channel thread, every few seconds), vectorized. The training thread pays a clock read and a list
append per instant and nothing per step. The ring holds ``events_maxlen`` instants (8,192: 2,048
steps of a plain loop, 227 with 8 batches per step), of which the last ``maxlen`` steps are read.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from perftracker.runtime.hooks import DATA_DONE, DATA_NEXT, STEP_POST, STEP_PRE

PHASES = ("data loading", "optimizer step", "forward/backward and collectives")


class PhaseTimes:
    """The hooks' phase ledger of one training process (training thread writes, any thread reads)."""

    def __init__(self, maxlen: int = 200, events_maxlen: int = 8192) -> None:
        self.maxlen = maxlen
        self._events: deque[int] = deque(maxlen=max(events_maxlen, 4))

    def feed(self, events: list[int]) -> None:
        """The hooks' logged events ``(t_ns << 2) | code``, in order (one C call)."""
        self._events.extend(events)

    # the instants one at a time (tests, callers without the hooks' log)
    def data_entered(self, t_ns: int) -> None:
        self._events.append((t_ns << 2) | DATA_NEXT)

    def data_returned(self, t_ns: int) -> None:
        self._events.append((t_ns << 2) | DATA_DONE)

    def step_done(self, pre_t_ns: int, post_t_ns: int) -> None:
        if pre_t_ns >= 0:
            self._events.append((pre_t_ns << 2) | STEP_PRE)
        self._events.append((post_t_ns << 2) | STEP_POST)

    def _latest(self, code: int) -> int:
        """The time of the latest instant of ``code`` in the ring; -1 if none."""
        events = self._events
        for i in range(1, min(len(events), 512) + 1):  # the latest step's instants are at the end
            try:
                e = events[-i]
            except IndexError:  # emptied meanwhile
                return -1
            if e & 3 == code:
                return e >> 2
        return -1

    @property
    def pre_ns(self) -> int:
        """The latest optimizer step's pre-hook time fed; -1 if none."""
        return self._latest(STEP_PRE)

    @property
    def post_ns(self) -> int:
        """The latest optimizer step's post-hook time fed; -1 if none."""
        return self._latest(STEP_POST)

    @property
    def rows(self) -> list[tuple[int, int, int]]:
        """The last ``maxlen`` steps as (post_t_ns, data_ns, step_ns) (any thread)."""
        return [(int(p), int(d), int(s)) for p, d, s in step_rows(list(self._events))[-self.maxlen:].tolist()]

    def recent_ms(self) -> np.ndarray:
        """The last steps' phases, steps × ``PHASES``, in ms (a copy; may be called from any thread)."""
        return phases_ms(self.rows)


def step_rows(events: list[int]) -> np.ndarray:
    """Logged instants ``(t_ns << 2) | code`` in order -> (steps, 3) int64 rows (post_t_ns, data_ns,
    step_ns), one per optimizer step (post-hook):

    - data_ns: the time from each DataLoader ``__next__`` entered to its return (a return counts
      once, for the latest entry before it), summed over the returns since the previous step;
    - step_ns: post-hook minus the latest pre-hook before it; 0 when there is none or it is later.

    The first row's data_ns misses the returns before the first event it is given (only its time
    is used by ``phases_ms``)."""
    e = np.asarray(events, dtype=np.int64)
    if e.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    code, t = e & 3, e >> 2
    idx = np.arange(e.size)
    last_next = np.maximum.accumulate(np.where(code == DATA_NEXT, idx, -1))
    is_done = code == DATA_DONE
    done_before = np.empty_like(idx)
    done_before[0] = -1
    done_before[1:] = np.maximum.accumulate(np.where(is_done, idx, -1))[:-1]
    counted = is_done & (last_next > done_before)  # an entry not yet returned
    waited = np.where(counted, t - t[np.maximum(last_next, 0)], 0)
    posts = np.flatnonzero(code == STEP_POST)
    at_post = np.cumsum(waited)[posts]
    data = np.diff(at_post, prepend=0)
    pre_idx = np.maximum.accumulate(np.where(code == STEP_PRE, idx, -1))[posts]
    pre = np.where(pre_idx >= 0, t[np.maximum(pre_idx, 0)], -1)
    post = t[posts]
    step = np.where((pre >= 0) & (pre <= post), post - pre, 0)
    return np.stack([post, data, step], axis=1)


def phases_ms(rows: list[tuple[int, int, int]]) -> np.ndarray:
    """Rows of (post_t_ns, data_ns, step_ns) to steps × (data, step, rest) in ms: one row per pair
    of consecutive steps; a row whose parts exceed its span (clock jitter) has rest 0."""
    if len(rows) < 2:
        return np.zeros((0, len(PHASES)))
    arr = np.asarray(rows, dtype=np.int64)
    span = np.diff(arr[:, 0])
    data, step = arr[1:, 1], arr[1:, 2]
    rest = np.clip(span - data - step, 0, None)
    return np.stack([data, step, rest], axis=1).astype(float) / 1e6
