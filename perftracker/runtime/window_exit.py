"""Ending profile windows at interpreter exit and at ``perftracker.deactivate()``.

Why this is needed: a Kineto profiler still enabled when the interpreter finalizes crashes the
process (SIGSEGV, rc 139), and a daemon writer thread still inside torch's C++ code at that moment
aborts it (SIGABRT). No iteration boundary will come to close an open window in either case, so
every ``ProfileWindow`` registers here, one ``atexit`` hook (registered with the first window) ends
them all, and ``Runtime.stop()`` calls ``shutdown_all`` too. ``WindowExit`` is a mixin of
``ProfileWindow`` (perftracker/runtime/window.py), which owns the state machine; ``shutdown_all`` is
re-exported there (``perftracker.runtime.window.shutdown_all``).

**A window near the end of training still yields a report** (issue 16). At interpreter exit
(``finish_at_exit``) the window is not thrown away:

- running in the training thread with at least one complete iteration: the profiler is stopped
  there and the window is cut at its last complete iteration (the last boundary: what follows is
  teardown, not training); then as below;
- being written: the writer stops yielding the CPU and the GIL (``Throttle.hurry``) and the exit
  hook waits for it, at most ``exit_wait_s`` (``PERFTRACKER_EXIT_DELAY_S``, 7 s by default). The
  raw window is then handed to the node agent as usual (WINDOW_DONE, flushed by the channel's own
  exit hook), and the agent summarizes and uploads it after this process has gone: the exiting
  process only builds the raw events file, it never summarizes;
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
from typing import TYPE_CHECKING, Any

from perftracker.runtime.window_writer import (
    _ACTIVE,
    _ARMED,
    _FINISHING,
    _IDLE,
    _OVERRUN,
    WindowOptions,
    WindowResult,
    _Active,
)

log = logging.getLogger("perftracker.runtime.window")  # one logger for the window's lines, whichever module


class WindowExit:
    """The exit half of ``ProfileWindow``: uses its lock, state, ``_claim``, ``_release`` and
    ``_deliver``."""

    options: WindowOptions
    _lock: threading.Lock
    _state: str
    _cur: _Active | None
    _finisher: threading.Thread | None
    _cancel: threading.Event  # set at exit: the writer stops at its next check
    _hurry: threading.Event  # set at exit: the writer stops yielding to training

    if TYPE_CHECKING:  # provided by ProfileWindow (perftracker/runtime/window.py)
        def _claim(self, cur: _Active, states: tuple[str, ...], to: str = ...) -> str | None: ...
        def _release(self, cur: _Active) -> Any: ...
        def _deliver(self, cur: _Active, res: WindowResult) -> None: ...
        def _finish(self, cur: _Active, holder: list[Any], end_ns: int, blocking_ns: int,
                    child: int | None) -> None: ...

    def shutdown(self, reason: str = "process exiting", writer_wait_s: float | None = None) -> None:
        """End this window now (exit hook, deactivate); never raises.

        Armed: cancelled. Running: profiler, samplers, GC callback, switch interval and NVTX undone
        (the profiler only from the thread that started it, the training thread), result discarded.
        Being written: with ``writer_wait_s`` (exit), the writer is cancelled and waited for that long.
        """
        cur = self._cur
        if cur is None:
            if writer_wait_s is not None:
                self._join_writer(writer_wait_s, "")
            return
        prev = self._claim(cur, (_ARMED, _ACTIVE, _OVERRUN))
        if prev == _OVERRUN:  # already reported; only the profiler is left (training thread only)
            cur.overrun_done.wait(1.0)
            try:
                if threading.get_ident() == cur.thread_ident:
                    self._release(cur)
            except Exception:  # noqa: BLE001
                log.debug("perftracker: releasing an abandoned window failed", exc_info=True)
            with self._lock:
                if self._cur is cur:
                    self._cur, self._state = None, _IDLE
            return
        if prev is None:
            if writer_wait_s is not None:
                self._cancel.set()
                self._hurry.set()
                self._join_writer(writer_wait_s, cur.session)
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
            self._release(cur)
        except Exception as exc:  # noqa: BLE001 - exit path: never raise
            error += f"; cleanup: {type(exc).__name__}: {exc}"
        if cur.sampler is not None:
            try:
                cur.sampler.close(timeout_s=0.5)
            except Exception:  # noqa: BLE001
                pass
        log.warning("perftracker: window %s %s (%s, %.2f s)", cur.session, error,
                    "was running" if prev == _ACTIVE else "had not started", time.monotonic() - t0)
        self._deliver(cur, WindowResult(cur.session, None, cur.start_ns, cur.start_ns, error=error))

    def finish_at_exit(self, wait_s: float) -> None:
        """Interpreter exit: hand this window to the agent if it can be done in ``wait_s`` (see the
        module doc), else discard it; never raises."""
        t0 = time.monotonic()
        cur = self._cur
        if cur is None:
            self._join_writer(wait_s, "")
            return
        state = self._state
        if state == _ACTIVE:
            if not self._cut_at_exit(cur):
                self.shutdown("process exiting", wait_s)
                return
        elif state != _FINISHING:
            self.shutdown("process exiting", wait_s)
            return
        self._hurry_writer()
        fin = self._finisher
        if fin is not None and fin.is_alive() and fin is not threading.current_thread():
            fin.join(max(0.0, wait_s - (time.monotonic() - t0)))
            if fin.is_alive():
                log.warning("perftracker: window %s: not written within the exit delay (%.1f s, "
                            "PERFTRACKER_EXIT_DELAY_S); cancelling it", cur.session, wait_s)
                self._cancel.set()
                self._join_writer(1.0, cur.session)
        if self._cur is None:
            log.info("perftracker: window %s handed over at exit after %.2f s", cur.session, time.monotonic() - t0)

    def _hurry_writer(self) -> None:
        """Training is over: the writer stops yielding the GIL (Throttle) and, where the OS lets an
        unprivileged process raise a thread's priority back, the CPU (nice 0)."""
        self._hurry.set()
        tid = getattr(self, "_writer_tid", 0)
        if tid:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, 0)
            except (OSError, AttributeError):
                pass

    def _cut_at_exit(self, cur: _Active) -> bool:
        """A running window at exit, in the training thread: stop the profiler and cut the window at
        its last complete iteration, then write it (hurried). False when that cannot be done."""
        if cur.capture is None or not cur.capture.started or threading.get_ident() != cur.thread_ident \
                or len(cur.boundaries_ns) < 2:
            return False
        if self._claim(cur, (_ACTIVE,)) is None:
            return False
        t0 = time.monotonic_ns()
        end_ns = cur.boundaries_ns[-1]
        try:
            result = self._release(cur)
        except Exception as exc:  # noqa: BLE001 - exit path: never raise
            error = f"discarded: process exiting; cleanup: {type(exc).__name__}: {exc}"
            log.warning("perftracker: window %s %s", cur.session, error)
            if cur.sampler is not None:
                cur.sampler.close(timeout_s=0.5)
            self._deliver(cur, WindowResult(cur.session, None, cur.start_ns, cur.start_ns, error=error))
            return True
        log.info("perftracker: window %s cut at exit at its last complete iteration (%d iterations)",
                 cur.session, len(cur.boundaries_ns) - 1)
        self._hurry.set()
        self._finisher = threading.Thread(target=self._finish,
                                          args=(cur, [result], end_ns, time.monotonic_ns() - t0, None),
                                          name="perftracker-window-writer", daemon=True)
        del result
        self._finisher.start()
        return True

    def _join_writer(self, wait_s: float, session: str) -> None:
        """Exit: wait (at most ``wait_s``) for the writer thread, also one that already delivered.

        A daemon thread still inside torch's C++ code (which releases the GIL) when the interpreter
        finalizes is ended by pthread_exit on its way back to the GIL, which unwinds through a C++
        destructor and aborts the whole process ("terminate called without an active exception").
        """
        fin = self._finisher
        if fin is None or not fin.is_alive() or fin is threading.current_thread():
            return
        fin.join(wait_s)
        if fin.is_alive():
            log.warning("perftracker: window %s: writer still busy after %.1f s; leaving it", session, wait_s)


_windows: weakref.WeakSet[WindowExit] = weakref.WeakSet()
_windows_lock = threading.Lock()
_atexit_registered = False


def _register(win: WindowExit) -> None:
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
            log.debug("perftracker: exit waited %.2f s after the last profiler stop", slept_s)
    except BaseException:  # noqa: BLE001
        pass
