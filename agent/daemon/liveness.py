"""Liveness of worker processes (psutil): dead, stopped, or alive (running but maybe silent).

The agent records each worker's pid and process creation time (``started_at``) when the worker
registers, and probes it when the worker goes quiet (no events, no snapshot). ``probe`` tells:

- ``dead``: no such process, a zombie, or the pid was reused: it now belongs to a process created
  at another time (psutil's ``create_time``);
- ``stopped``: stopped by a signal (SIGSTOP / SIGTSTP) or by a tracer;
- ``disk_wait``: uninterruptible sleep in the kernel (state ``D``: a hung filesystem or device);
- ``alive``: any other state. A worker that is alive but sends nothing is *frozen*: for example
  its main thread holds the GIL in C code, so its controller thread cannot take a snapshot.

Only for this machine's processes; a silent agent (a dead host) is the service's business.
"""

from __future__ import annotations

import logging
import os
import select
import time
from dataclasses import dataclass
from enum import StrEnum

import psutil

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

# psutil's status words -> our states; every other status (running, sleeping, idle, ...) is alive
_STATES = {
    psutil.STATUS_ZOMBIE: ProcState.DEAD,
    psutil.STATUS_DEAD: ProcState.DEAD,
    psutil.STATUS_STOPPED: ProcState.STOPPED,
    psutil.STATUS_TRACING_STOP: ProcState.STOPPED,
    psutil.STATUS_DISK_SLEEP: ProcState.DISK_WAIT,
}


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    state: ProcState
    status: str  # psutil's status word ("sleeping", "disk-sleep", "zombie", ...), "" when gone
    started: float  # the process's creation time (psutil, seconds since the epoch); 0.0 when gone

    @property
    def detail(self) -> str:
        return DETAIL[self.state]


def state_of(status: str) -> ProcState:
    """Our state for one of psutil's status words."""
    return _STATES.get(status, ProcState.ALIVE)


def started_at(pid: int) -> float:
    """The creation time of ``pid`` to remember at registration (it tells the process from a later
    one given the same pid); 0.0 if the process is gone."""
    if pid <= 0:
        return 0.0
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return 0.0


def probe(pid: int, started: float = 0.0) -> ProcInfo:
    """Classify a process. Pass the ``started`` recorded at registration to catch pid reuse.
    Raises psutil.AccessDenied where the process cannot be read (the caller says "unknown")."""
    gone = ProcInfo(pid, ProcState.DEAD, "", 0.0)
    if pid <= 0:
        return gone
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():  # one read of /proc/<pid>/stat for both
            created = float(proc.create_time())
            status = str(proc.status())
    except psutil.NoSuchProcess:  # gone (a zombie's status is read, not raised)
        return gone
    if started and created != started:
        return gone  # the pid now belongs to another process
    return ProcInfo(pid, state_of(status), status, created)


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

    def add(self, pid: int, started: float = 0.0) -> bool:
        if pid in self._fds or pid in self.exited_ns:
            return True
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError) as exc:
            log.debug("liveness: no pidfd for pid %d: %s", pid, exc)
            return False
        if started and started_at(pid) != started:  # reused before we got here
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
