"""Handing a window to a process that outlives the trainer (issue 30, Deliver 4).

At interpreter exit the training process no longer builds the raw window itself within the exit
delay (7 s before, and windows that took longer were lost). The profiler result is already in this
process's memory once the profiler is stopped; ``fork_detached`` forks a child that holds a copy of
it, leaves the trainer's session (``setsid``: torchrun or a shell that signals the trainer's
process group does not stop it), builds and saves the ``RawWindow`` file, and exits. The trainer
delivers its ``WindowResult`` at once, with the file's path and the child's pid
(``WindowResult.writer_pid``); WINDOW_DONE carries the pid, and the node agent waits for the file
(agent/daemon/handed_window.py) before it summarizes it, after the trainer has gone.

The child saves the file atomically (``RawWindow.save``), so the file's presence means it is
whole; a failure leaves ``<raw>.error`` beside it with one line. The child bounds its own life
with ``alarm``: nobody is left to kill it. It never returns into the trainer's code (``os._exit``).

Not verified on GPU hardware: a CUDA process forks as a ``DataLoader`` worker does; the child reads
only the profiler result's host memory and numpy, and never calls CUDA.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any, Protocol

from perftracker.runtime.window.state import WindowOptions, WindowResult, _Active
from perftracker.runtime.window.writer import _lower_priority

log = logging.getLogger("perftracker.runtime.window.profile")

DETACHED_LIFE_S = 600  # a detached child still alive this long after the fork ends itself (SIGALRM)
SAMPLES_WAIT_S = 10.0  # the child waits this long for the worker's own sampler file (spawn_sampler)


class _Builder(Protocol):
    options: WindowOptions

    def path(self, session: str, what: str) -> Path: ...

    def build(self, cur: _Active, result: Any, end_ns: int, throttle: Any = ...) -> Any: ...


def error_path(raw_path: Path) -> Path:
    """Where a child that failed leaves its one line."""
    return raw_path.with_name(raw_path.name + ".error")


def fork_detached(writer: _Builder, cur: _Active, result: Any, end_ns: int) -> int | None:
    """Fork a child that writes ``cur``'s raw window from ``result`` after this process exits; its
    pid, or None (logged) when fork is unavailable or fails. Any thread may call it: the child
    continues in a copy of the calling thread only."""
    if not hasattr(os, "fork"):
        return None
    path = writer.path(cur.session, "raw")
    samples = cur.sampler.out if cur.sampler is not None else None
    try:
        path.unlink(missing_ok=True)  # the file's presence is the child's success
        error_path(path).unlink(missing_ok=True)
        pid = os.fork()
    except OSError as exc:
        log.warning("perftracker: fork failed (%s); the window is written in this process", exc)
        return None
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.setsid()
            try:  # the trainer's own SIGALRM handler, if any, must not outlive it here
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
            except (ValueError, OSError):
                pass
            signal.alarm(DETACHED_LIFE_S)
            # training on other ranks of this node may still run: not SCHED_IDLE (nothing would wake it
            # on a saturated node once this rank is gone), but a low priority
            _lower_priority(0, writer.options.writer_nice, writer.options.helper_cpus)
            raw = writer.build(cur, result, end_ns)
            if samples is not None:  # the sampler process stops when this process exits, then writes
                deadline = time.monotonic() + SAMPLES_WAIT_S
                while not samples.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            raw.save(path)
            code = 0
        except BaseException as exc:  # noqa: BLE001
            try:
                error_path(path).write_text(f"{type(exc).__name__}: {exc}"[:300])
            except BaseException:  # noqa: BLE001
                pass
        finally:
            os._exit(code)
    return pid


def hand_over(writer: _Builder, cur: _Active, result: Any, end_ns: int, blocking_ns: int,
              child: int | None) -> WindowResult:
    """At exit (the writer's ``detach``): the conversion child already running, else a new detached
    one, writes the file after this process has gone; the result names the pid to wait for."""
    raw_path = writer.path(cur.session, "raw")
    samples = cur.sampler.out if cur.sampler is not None else None
    pid = child if child is not None and _running(child) else None
    iterations = len(cur.boundaries_ns) - 1
    if pid is None and child is not None and raw_path.exists():  # the child has just written it
        return WindowResult(cur.session, raw_path, cur.start_ns, end_ns, "", samples, blocking_ns, iterations)
    if pid is not None:  # from SCHED_IDLE back to normal scheduling, where the OS allows it
        try:
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass
    else:
        pid = fork_detached(writer, cur, result, end_ns)
    if not pid:
        return WindowResult(cur.session, None, cur.start_ns, end_ns, "discarded: process exiting (fork failed)",
                            blocking_ns=blocking_ns)
    log.info("perftracker: window %s handed to process %d, which writes %s after this process exits",
             cur.session, pid, raw_path)
    return WindowResult(cur.session, raw_path, cur.start_ns, end_ns, "", samples, blocking_ns, iterations,
                        writer_pid=pid)


def _running(pid: int) -> bool:
    """A child of this process still running (one that ended is reaped here)."""
    try:
        got, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return got == 0
