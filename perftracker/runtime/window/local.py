"""The worker's own path (no agent): run the profile window and the sampler process from this
training process. ``LocalWindowSink`` is a ``TriggerSink`` that does it on every trigger."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from perftracker.runtime.protocols import LocalRuntime
from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult

log = logging.getLogger(__name__)

_local: ProfileWindow | None = None
_local_lock = threading.Lock()


def run_local_window(
    runtime: LocalRuntime,
    session: str,
    window_s: float,
    out_dir: str | Path,
    on_done: Callable[[WindowResult], None] | None = None,
    options: WindowOptions | None = None,
) -> bool:
    """Arm this process's local window (spawning the procfs sampler process) on ``runtime``."""
    global _local
    with _local_lock:
        if _local is None or _local.out_dir != Path(out_dir) or _local._runtime is not runtime:
            config = runtime.config
            opts = options or WindowOptions(
                spawn_sampler=True, stacks=config.window_stacks, stack_period_us=config.window_stack_period_us,
                writer=config.window_writer, exit_wait_s=config.exit_delay_s, converge=config.window_converge,
                converge_tolerance=config.window_tolerance)
            _local = ProfileWindow(runtime.identity, out_dir, options=opts, runtime=runtime)
        win = _local

    def _done(res: WindowResult) -> None:
        if res.error and not res.error.startswith("discarded"):  # shutdown() logged those
            log.warning("perftracker: window %s: %s", res.session, res.error)
        if on_done is not None:
            on_done(res)

    return win.arm(session, window_s, _done)


class LocalWindowSink:
    """A TriggerSink that profiles a window locally on every trigger (no agent needed)."""

    def __init__(self, runtime: LocalRuntime, out_dir: str | Path, window_s: float | None = None,
                 on_done: Callable[[WindowResult], None] | None = None) -> None:
        self.runtime = runtime
        self.out_dir = Path(out_dir)
        self.window_s = window_s
        self.on_done = on_done
        self.results: list[WindowResult] = []

    def on_trigger(self, reason: str, detail: Mapping[str, object]) -> None:
        window_s = self.window_s if self.window_s is not None else float(self.runtime.config.window_s)
        # Every rank triggered at the same iteration names the same session.
        session = str(detail.get("session", "") or f"local-it{detail.get('iteration', 0)}")

        def _done(res: WindowResult) -> None:
            self.results.append(res)
            if self.on_done is not None:
                self.on_done(res)

        run_local_window(self.runtime, session, window_s, self.out_dir, _done)

    def on_blocked(self, detail: Mapping[str, object]) -> None:
        log.warning("perftracker: training looks blocked: %s", dict(detail))
