"""Crash capture in the worker: when and how the training thread ended (issue 22).

Costs nothing until it is needed: ``install()`` chains one function in front of the user's
``sys.excepthook`` and ``threading.excepthook`` (never replacing them; the hook that was there is
called right after, with the same arguments). The function only notes the exception and the wall
time it reached the top of its thread; it never raises (a failure of its own is swallowed, and the
user's hook still runs).

At interpreter exit the agent channel (perftracker/runtime/channel.py ``at_exit``) turns the noted
exception of the training thread into a crash snapshot (``crash_snapshot``): a ``HangSnapshot``
with ``end="exception"``, the exception's traceback as the stack and ``failed_ns`` from the hook.
``SystemExit`` never reaches ``sys.excepthook``: an ``exit(3)`` is seen by the node agent from the
process's exit status instead (agent/daemon/worker_exits.py). A thread other than the training thread that dies
of an exception does not end training and is not a crash by itself; it is kept (the last few) for
the log.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from perftracker.model import HangSnapshot
from perftracker.runtime.protocols import SnapshotRuntime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Failure:
    """One uncaught exception, as the hook saw it."""

    exc: BaseException
    thread_name: str
    native_id: int  # the thread's native id (0 unknown)
    main: bool  # raised in the main thread
    failed_ns: int  # wall clock when it reached the hook


_lock = threading.Lock()
_installed = False
_failures: list[Failure] = []  # the last few, newest last
_MAX_KEPT = 8


def install() -> None:
    """Chain the capture in front of the current ``sys.excepthook`` and ``threading.excepthook``
    (once per process); never raises."""
    global _installed
    try:
        with _lock:
            if _installed:
                return
            prev_sys = sys.excepthook
            prev_thread = threading.excepthook

            def sys_hook(tp: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
                _note(value, threading.main_thread(), True)
                prev_sys(tp, value, tb)

            def thread_hook(args: Any) -> None:
                _note(getattr(args, "exc_value", None), getattr(args, "thread", None), False)
                prev_thread(args)

            sys_hook.__wrapped__ = prev_sys  # type: ignore[attr-defined]
            thread_hook.__wrapped__ = prev_thread  # type: ignore[attr-defined]
            sys.excepthook = sys_hook
            threading.excepthook = thread_hook
            _installed = True
    except Exception:  # noqa: BLE001 - never disturb the user's process
        log.debug("perftracker: crash hooks not installed", exc_info=True)


def _note(exc: BaseException | None, thread: Any, main: bool) -> None:
    """Record one uncaught exception; never raises (it runs inside the user's excepthook chain)."""
    try:
        if exc is None or isinstance(exc, (SystemExit, KeyboardInterrupt)):
            return
        f = Failure(exc, str(getattr(thread, "name", "") or ""), int(getattr(thread, "native_id", 0) or 0), main,
                    time.time_ns())
        with _lock:
            _failures.append(f)
            del _failures[:-_MAX_KEPT]
    except Exception:  # noqa: BLE001
        pass


def failures() -> list[Failure]:
    with _lock:
        return list(_failures)


def training_failure(training_tid: int = 0) -> Failure | None:
    """The failure that ended the training thread (``training_tid``, the main thread by default):
    the first one noted for it. Exceptions of other threads do not end training."""
    for f in failures():
        if (training_tid and f.native_id == training_tid) or (f.main and not training_tid) or \
                (f.main and training_tid == threading.main_thread().native_id):
            return f
    return None


def ending_exception(training_tid: int = 0) -> tuple[BaseException, int] | None:
    """(exception, failed_ns) that is ending this process, or None: the training thread's noted
    failure, else the interpreter's ``sys.last_value`` (set for the main thread even when the user's
    own excepthook replaced ours), with an unknown time (0)."""
    f = training_failure(training_tid)
    if f is not None:
        return f.exc, f.failed_ns
    exc = getattr(sys, "last_value", None)
    if isinstance(exc, BaseException) and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return exc, 0
    return None


def crash_snapshot(runtime: SnapshotRuntime, exc: BaseException, failed_ns: int = 0, session: str = "") -> HangSnapshot | None:
    """The crash snapshot of ``exc``: the exit snapshot (perftracker.runtime.hang_capture.exit_snapshot) marked as a
    failure. None when it cannot be built; never raises."""
    try:
        from perftracker.runtime.hang_capture import exit_snapshot

        snap = exit_snapshot(runtime, exc, session)
        if snap is None:
            return None
        if not snap.error:
            snap = dataclasses.replace(snap, error=type(exc).__name__)
        return dataclasses.replace(snap, end="exception", exit_code=1, failed_ns=failed_ns or snap.taken_ns)
    except Exception:  # noqa: BLE001
        log.debug("perftracker: crash snapshot failed", exc_info=True)
        return None
