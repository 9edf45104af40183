"""Liveness of worker processes, from procfs: dead, stopped, or alive (running but maybe silent).

The agent records each worker's pid and process start time when the worker registers, and
probes it when the worker goes quiet (no events, no snapshot). ``probe`` tells:

- ``dead``: no such process, a zombie (``Z``/``X``), or the pid was reused by a process with
  another start time;
- ``stopped``: state ``T`` (SIGSTOP / SIGTSTP) or ``t`` (stopped by a tracer);
- ``disk_wait``: state ``D``, uninterruptible sleep in the kernel (a hung filesystem or device);
- ``alive``: any other state. A worker that is alive but sends nothing is *frozen*: for example
  its main thread holds the GIL in C code, so its controller thread cannot take a snapshot.

Only for this machine's processes (procfs); a silent agent (a dead host) is the service's
business.
"""

from __future__ import annotations

import logging
import os
import select
import time
from dataclasses import dataclass
from enum import StrEnum

log = logging.getLogger(__name__)


class ProcState(StrEnum):
    ALIVE = "alive"
    STOPPED = "stopped"
    DISK_WAIT = "disk_wait"
    DEAD = "dead"


# plain words for reports: "rank 2 silent for 40 s (process stopped)"
DETAIL = {
    ProcState.ALIVE: "process running but silent",
    ProcState.STOPPED: "process stopped",
    ProcState.DISK_WAIT: "process stuck in uninterruptible kernel wait",
    ProcState.DEAD: "process dead",
}


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    state: ProcState
    state_letter: str  # the raw procfs state letter, "" when dead
    start_ticks: int  # field 22 of /proc/<pid>/stat (clock ticks after boot); 0 when dead

    @property
    def detail(self) -> str:
        return DETAIL[self.state]


def read_stat(pid: int, proc_root: str = "/proc") -> tuple[str, int] | None:
    """(state letter, start time in ticks) of a process, or None if it does not exist."""
    try:
        with open(f"{proc_root}/{int(pid)}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        log.debug("liveness: cannot read stat of pid %s: %s", pid, exc)
        return None
    try:
        rest = raw[raw.rindex(")") + 2:].split()
        return rest[0], int(rest[19])  # fields 3 and 22 (1-based) after "pid (comm)"
    except (ValueError, IndexError):
        return None


def probe(pid: int, start_ticks: int = 0, proc_root: str = "/proc") -> ProcInfo:
    """Classify a process. Pass the ``start_ticks`` recorded at registration to catch pid reuse."""
    st = read_stat(pid, proc_root) if pid > 0 else None
    if st is None:
        return ProcInfo(pid, ProcState.DEAD, "", 0)
    letter, ticks = st
    if start_ticks and ticks != start_ticks:
        return ProcInfo(pid, ProcState.DEAD, "", 0)  # the pid now belongs to another process
    if letter in ("Z", "X", "x"):
        return ProcInfo(pid, ProcState.DEAD, letter, ticks)
    if letter in ("T", "t"):
        return ProcInfo(pid, ProcState.STOPPED, letter, ticks)
    if letter == "D":
        return ProcInfo(pid, ProcState.DISK_WAIT, letter, ticks)
    return ProcInfo(pid, ProcState.ALIVE, letter, ticks)


def start_ticks_of(pid: int, proc_root: str = "/proc") -> int:
    """The process start time to remember at registration; 0 if the process is gone."""
    st = read_stat(pid, proc_root)
    return st[1] if st else 0


class ExitWatch:
    """Exact exit times of processes that are not our children, from pidfds (Linux >= 5.3).

    A pidfd becomes readable when its process terminates, so the order in which workers die is
    known to the millisecond: when one rank is SIGKILLed, torchrun SIGTERMs the others some tens
    of milliseconds later, and the first to go is the culprit. ``fileno(pid)`` lets an asyncio
    loop ``add_reader`` the pidfd; ``poll`` serves threads and tests. Where pidfds are missing,
    ``add`` returns False and the caller falls back to ``probe``.
    """

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # pid -> pidfd
        self.exited_ns: dict[int, int] = {}  # pid -> wall-clock ns when the exit was seen

    def add(self, pid: int, start_ticks: int = 0) -> bool:
        if pid in self._fds or pid in self.exited_ns:
            return True
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError) as exc:
            log.debug("liveness: no pidfd for pid %d: %s", pid, exc)
            return False
        if start_ticks and start_ticks_of(pid) != start_ticks:  # reused before we got here
            os.close(fd)
            self.exited_ns[pid] = time.time_ns()
            return True
        self._fds[pid] = fd
        return True

    def fileno(self, pid: int) -> int:
        return self._fds[pid]

    def mark_exited(self, pid: int) -> int:
        """Record ``pid``'s exit now (call it when its pidfd is readable); returns the time."""
        fd = self._fds.pop(pid, None)
        if fd is not None:
            os.close(fd)
        return self.exited_ns.setdefault(pid, time.time_ns())

    def poll(self, timeout_s: float = 0.0) -> list[tuple[int, int]]:
        """Wait up to ``timeout_s`` for exits; returns the new (pid, exited_ns), in order seen."""
        if not self._fds:
            return []
        p = select.poll()
        by_fd = {fd: pid for pid, fd in self._fds.items()}
        for fd in by_fd:
            p.register(fd, select.POLLIN)
        out = []
        for fd, _ev in p.poll(max(0, int(timeout_s * 1000))):
            pid = by_fd[fd]
            out.append((pid, self.mark_exited(pid)))
        return out

    def discard(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is not None:
            os.close(fd)
        self.exited_ns.pop(pid, None)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
