"""Ending profile windows at interpreter exit and at ``perftracker.deactivate()``.

Why this is needed: a Kineto profiler still enabled when the interpreter finalizes crashes the
process (SIGSEGV, rc 139), and a daemon writer thread still inside torch's C++ code at that moment
aborts it (SIGABRT). No iteration boundary will come to close an open window in either case, so
every ``ProfileWindow`` registers here, one ``atexit`` hook (registered with the first window) ends
them all, and ``Runtime.stop()`` calls ``shutdown_all`` too. Each ``ProfileWindow``
(perftracker/runtime/window/profile.py), which owns the state machine, owns a ``WindowExit`` and calls it;
``shutdown_all`` is re-exported there (``perftracker.runtime.window.profile.shutdown_all``).

**A window near the end of training still yields a report** (issues 16 and 30). At interpreter
exit (``finish_at_exit``) the window is not thrown away:

- running in the training thread with at least one complete iteration: the profiler is stopped
  there and the window is cut at its last complete iteration (the last boundary: what follows is
  teardown, not training); then as below;
- being written: the writer thread hands the work to a child process that outlives this one
  (``WindowOptions.exit_handoff``, perftracker/runtime/window/handoff.py: the conversion child
  already running, else a detached fork holding the profiler result) and delivers at once, with
  the child's pid in the result. The raw window goes to the node agent as usual (WINDOW_DONE,
  flushed by the channel's own exit hook); the agent waits for the child's file and summarizes and
  uploads it after this process has gone. The exit hook waits for that hand-over (a fork, well
  under a second), at most ``exit_wait_s`` (``PERFTRACKER_EXIT_DELAY_S``, 7 s by default);
- without fork (``exit_handoff`` off, or no ``os.fork``) the writer stops yielding the CPU and the
  GIL (``Throttle.hurry``) and builds the file itself within ``exit_wait_s``;
- a writer still busy at the limit is cancelled: the window is discarded and logged once.

An armed window (not started), or a running one with no complete iteration, is discarded as before.
``perftracker.deactivate()`` (``shutdown``) still discards: it is asked for, and training goes on.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any, Protocol

from perftracker.runtime.window.state import (
    _ACTIVE,
    _ARMED,
    _FINISHING,
    _OVERRUN,
    WindowOptions,
    WindowResult,
    _Active,
)
from perftracker.runtime.window.writer import WindowWriter

log = logging.getLogger("perftracker.runtime.window.profile")  # one logger for the window's lines, whichever module


class _Window(Protocol):
    """What the exit path needs of the window it ends: ``ProfileWindow`` (perftracker/runtime/window/profile.py),
    which owns the state machine and its lock."""

    options: WindowOptions
    writer: WindowWriter

    @property
    def state(self) -> str: ...

    @property
    def current(self) -> _Active | None: ...

    def _claim(self, cur: _Active, states: tuple[str, ...], to: str = ...) -> str | None: ...

    def _release(self, cur: _Active) -> Any: ...

    def _deliver(self, cur: _Active, res: WindowResult) -> None: ...

    def _idle(self, cur: _Active) -> None: ...


class WindowExit:
    """The exit part of a ``ProfileWindow``: ends it at interpreter exit or deactivation (see the
    module docstring). The window owns it and calls ``shutdown`` and ``finish_at_exit``."""

    def __init__(self, window: _Window) -> None:
        self._win = window

    def shutdown(self, reason: str = "process exiting", writer_wait_s: float | None = None) -> None:
        """End the window now (exit hook, deactivate); never raises.

        Armed: cancelled. Running: profiler, samplers, GC callback, switch interval and NVTX undone
        (the profiler only from the thread that started it, the training thread), result discarded.
        Being written: with ``writer_wait_s`` (exit), the writer is cancelled and waited for that long.
        """
        win, writer = self._win, self._win.writer
        cur = win.current
        if cur is None:
            if writer_wait_s is not None:
                writer.join(writer_wait_s, "")
            return
        prev = win._claim(cur, (_ARMED, _ACTIVE, _OVERRUN))
        if prev == _OVERRUN:  # already reported; only the profiler is left (training thread only)
            cur.overrun_done.wait(1.0)
            try:
                if threading.get_ident() == cur.thread_ident:
                    win._release(cur)
            except Exception:  # noqa: BLE001
                log.debug("perftracker: releasing an abandoned window failed", exc_info=True)
            win._idle(cur)
            return
        if prev is None:
            if writer_wait_s is not None:
                writer.cancelled.set()
                writer.hurried.set()
                writer.join(writer_wait_s, cur.session)
            return
        t0 = time.monotonic()
        error = f"discarded: {reason}"
        try:
            if prev == _ACTIVE and cur.capture is not None and cur.capture.started \
                    and threading.get_ident() != cur.thread_ident:
                # torch's profiler state lives in the thread that enabled it; stopping it from here
                # does nothing, so leave it to that thread and undo the rest.
                cur.capture = None
                error += " (the profiler stays on in the training thread)"
            win._release(cur)
        except Exception as exc:  # noqa: BLE001 - exit path: never raise
            error += f"; cleanup: {type(exc).__name__}: {exc}"
        if cur.sampler is not None:
            try:
                cur.sampler.close(timeout_s=0.5)
            except Exception:  # noqa: BLE001
                pass
        log.warning("perftracker: window %s %s (%s, %.2f s)", cur.session, error,
                    "was running" if prev == _ACTIVE else "had not started", time.monotonic() - t0)
        win._deliver(cur, WindowResult(cur.session, None, cur.start_ns, cur.start_ns, error=error))

    def finish_at_exit(self, wait_s: float) -> None:
        """Interpreter exit: hand the window to the agent if it can be done in ``wait_s`` (see the
        module doc), else discard it; never raises."""
        t0 = time.monotonic()
        win, writer = self._win, self._win.writer
        cur = win.current
        if cur is None:
            writer.join(wait_s, "")
            return
        state = win.state
        if win.options.exit_handoff and hasattr(os, "fork") and not cur.fork_unsafe:
            writer.detach.set()  # the file is written by a child that outlives this process (window_handoff.py)
        if state == _ACTIVE:
            if not self._cut_at_exit(cur):
                self.shutdown("process exiting", wait_s)
                return
        elif state != _FINISHING:
            self.shutdown("process exiting", wait_s)
            return
        writer.hurry()
        log.info("perftracker: window %s at exit: %s, writer hurried after %.2f s", cur.session, state,
                 time.monotonic() - t0)
        fin = writer.thread
        if fin is not None and fin.is_alive() and fin is not threading.current_thread():
            fin.join(max(0.0, wait_s - (time.monotonic() - t0)))
            if fin.is_alive():
                log.warning("perftracker: window %s: not written within the exit delay (%.1f s, "
                            "PERFTRACKER_EXIT_DELAY_S); cancelling it", cur.session, wait_s)
                writer.cancelled.set()
                writer.join(1.0, cur.session)
        if win.current is None:
            log.info("perftracker: window %s handed over at exit after %.2f s", cur.session, time.monotonic() - t0)

    def _cut_at_exit(self, cur: _Active) -> bool:
        """A running window at exit, in the training thread: stop the profiler and cut the window at
        its last complete iteration, then write it (hurried). False when that cannot be done."""
        win = self._win
        if cur.capture is None or not cur.capture.started or threading.get_ident() != cur.thread_ident \
                or len(cur.boundaries_ns) < 2:
            return False
        if win._claim(cur, (_ACTIVE,)) is None:
            return False
        t0 = time.monotonic_ns()
        end_ns = cur.boundaries_ns[-1]
        try:
            result = win._release(cur)
        except Exception as exc:  # noqa: BLE001 - exit path: never raise
            error = f"discarded: process exiting; cleanup: {type(exc).__name__}: {exc}"
            log.warning("perftracker: window %s %s", cur.session, error)
            if cur.sampler is not None:
                cur.sampler.close(timeout_s=0.5)
            win._deliver(cur, WindowResult(cur.session, None, cur.start_ns, cur.start_ns, error=error))
            return True
        log.info("perftracker: window %s cut at exit at its last complete iteration (%d iterations)",
                 cur.session, len(cur.boundaries_ns) - 1)
        win.writer.hurried.set()
        holder = [result]  # the writer empties it (see WindowWriter.finish)
        del result
        win.writer.start(cur, holder, end_ns, time.monotonic_ns() - t0, None)
        return True


class _Exiting(Protocol):
    """A window as the process-wide exit hook sees it (``ProfileWindow``)."""

    options: WindowOptions

    def shutdown(self, reason: str = ..., writer_wait_s: float | None = ...) -> None: ...

    def finish_at_exit(self, wait_s: float) -> None: ...


_windows: weakref.WeakSet[_Exiting] = weakref.WeakSet()
_windows_lock = threading.Lock()
_atexit_registered = False


def _register(win: _Exiting) -> None:
    """Called by every new window: the exit hook must find it, and is registered once, lazily, so
    that a process that never profiles has no hook."""
    global _atexit_registered
    with _windows_lock:
        _windows.add(win)
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True


def shutdown_all(reason: str = "perftracker deactivated", writer_wait_s: float | None = None) -> None:
    """End every open window of this process (see ``WindowExit.shutdown``); never raises."""
    with _windows_lock:
        wins = list(_windows)
    for win in wins:
        try:
            win.shutdown(reason, writer_wait_s)
        except Exception:  # noqa: BLE001 - runs at exit and in deactivate()
            log.debug("perftracker: window shutdown failed", exc_info=True)


def finish_all_at_exit() -> None:
    """Hand every open window of this process to the agent, within its ``exit_wait_s``; never raises."""
    with _windows_lock:
        wins = list(_windows)
    for win in wins:
        try:
            win.finish_at_exit(win.options.exit_wait_s)
        except Exception:  # noqa: BLE001 - runs at exit
            log.debug("perftracker: window exit failed", exc_info=True)


def _at_exit() -> None:
    """Registered once: no profiler may be enabled when the interpreter finalizes (it segfaults)."""
    try:
        finish_all_at_exit()
        from perftracker.runtime.profiler import settle_after_stop

        slept_s = settle_after_stop()  # torch aborts a process that exits right after a stop
        if slept_s > 0:
            log.info("perftracker: exit waited %.2f s after the last profiler stop", slept_s)
    except BaseException:  # noqa: BLE001
        pass
