"""The training thread's Python stack, sampled from the sampler process (perftracker/remote_stacks.py).

The window sends ``pystacks {"path": ..., "period_us": ..., "layout": ...}`` over the control input when it opens;
``PyStackThread`` then reads the stack every PERIOD_US until the window's bounds are done and
``save()`` writes PATH (before the sampler's own file, so that file's presence means both are
written). Nothing runs in the training process.
"""

from __future__ import annotations

import logging
import threading
import time

from perftracker.agent.samplers.base import WindowBounds

from perftracker.remote_stacks import RemoteCode, RemoteStackReader, StackLayout, save_samples

log = logging.getLogger(__name__)


class PyStackThread:
    def __init__(self, pid: int, path: str, period_us: int, layout: StackLayout, bounds: WindowBounds) -> None:
        self.reader = RemoteStackReader(pid, layout)
        self.path = path
        self.period_ns = max(1, period_us) * 1000
        self.bounds = bounds
        self.t_ns: list[int] = []
        self.samples: list[tuple[tuple[int, RemoteCode], ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pystacks", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_ns = time.monotonic_ns()
        try:
            while not self._stop.is_set() and not self.bounds.done(next_ns):
                t0 = time.monotonic_ns()
                stack = self.reader.sample()
                t1 = time.monotonic_ns()
                if stack is not None:
                    self.t_ns.append((t0 + t1) // 2)
                    self.samples.append(stack)
                next_ns += self.period_ns
                sleep_ns = next_ns - time.monotonic_ns()
                if sleep_ns > 0:
                    time.sleep(sleep_ns / 1e9)
                else:
                    next_ns = time.monotonic_ns()
        except Exception:  # noqa: BLE001 - keep the samples taken so far
            log.exception("python stack sampling failed")

    def save(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        save_samples(self.path, self.t_ns, self.samples)
        log.info("python stacks: %d samples (%d torn reads dropped), %d codes -> %s", len(self.samples),
                 self.reader.torn, len(self.reader.codes), self.path)
