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
share); a loop without a DataLoader has ``data_ms`` 0. Costs the training thread one clock read
and a few attribute updates per batch and per step; the rows are kept in a ring of ``maxlen``.
"""

from __future__ import annotations

from collections import deque

import numpy as np

PHASES = ("data loading", "optimizer step", "forward/backward and collectives")


class PhaseTimes:
    """The hooks' phase ledger of one training process (training thread writes, any thread reads)."""

    def __init__(self, maxlen: int = 200) -> None:
        self.rows: deque[tuple[int, int, int]] = deque(maxlen=maxlen)  # (post_t_ns, data_ns, step_ns)
        self._enter_ns = -1
        self._data_ns = 0

    def data_entered(self, t_ns: int) -> None:
        self._enter_ns = t_ns

    def data_returned(self, t_ns: int) -> None:
        if self._enter_ns >= 0:
            self._data_ns += t_ns - self._enter_ns
            self._enter_ns = -1

    def step_done(self, pre_t_ns: int, post_t_ns: int) -> None:
        step_ns = post_t_ns - pre_t_ns if 0 <= pre_t_ns <= post_t_ns else 0
        self.rows.append((post_t_ns, self._data_ns, step_ns))
        self._data_ns = 0

    def recent_ms(self) -> np.ndarray:
        """The last steps' phases, steps × ``PHASES``, in ms (a copy; may be called from any thread)."""
        return phases_ms(list(self.rows))


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
