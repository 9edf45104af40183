"""A raw window that the worker handed to a child process at its exit (issue 30).

At interpreter exit a worker no longer writes its window within the exit delay: a child process
that outlives it writes the file (perftracker/runtime/window/handoff.py), and WINDOW_DONE carries
that child's pid as ``writer_pid``. ``wait_for_file`` waits for the file before the agent
summarizes it: the child saves it atomically, so its presence means it is whole; a child that
failed leaves ``<raw>.error`` (one line), and a child that died without either is reported as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import psutil
from perftracker.agent.daemon.helper_processes import ProcessingError

HANDED_WAIT_S = 300.0  # the longest wait for a handed-over window's file (the child ends itself at 600 s)
POLL_S = 0.1


def _ended(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


async def wait_for_file(raw: Path, pid: int, timeout_s: float = HANDED_WAIT_S, poll_s: float = POLL_S) -> float:
    """Wait until the child ``pid`` has written ``raw``; the seconds waited. ProcessingError (with
    the child's own line when it left one) when it failed, died without the file, or took longer
    than ``timeout_s``."""
    t0 = time.monotonic()
    err = raw.with_name(raw.name + ".error")
    while True:
        if raw.exists():
            return time.monotonic() - t0
        if err.exists():
            why = ""
            with contextlib.suppress(OSError):
                why = err.read_text(errors="replace")[:300]
                err.unlink()
            raise ProcessingError(f"the process that wrote the window at the worker's exit failed: {why}")
        if _ended(pid):
            if raw.exists():  # written between the two checks
                return time.monotonic() - t0
            raise ProcessingError(f"the process {pid} that wrote the window at the worker's exit ended without it")
        if time.monotonic() - t0 > timeout_s:
            raise ProcessingError(f"the window handed over at the worker's exit was not written within {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)
