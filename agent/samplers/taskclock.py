"""A thread's exact CPU time through ``perf_event_open(PERF_COUNT_SW_TASK_CLOCK)`` (ctypes, no deps).

The software counter counts the nanoseconds the thread has spent on a CPU. Unlike
``/proc/<pid>/task/<tid>/schedstat`` (brought up to date only at scheduler ticks and context
switches), a ``read()`` of the counter first updates it, on the thread's CPU if it is running
there, so every reading is the thread's exact run time at that moment.

Permissions (checked by the kernel at open): CAP_PERFMON (or CAP_SYS_ADMIN, e.g. root on the
host), or ``/proc/sys/kernel/perf_event_paranoid`` <= 1; plus ptrace-read access to the target
(same uid, or CAP_SYS_PTRACE), and a seccomp profile that lets ``perf_event_open`` through (the
default Docker/containerd profile allows it only with CAP_PERFMON or CAP_SYS_ADMIN). ``open_task_clock``
raises ``TaskClockUnavailable`` with the reason when any of that is missing; the caller falls back
to schedstat.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from perftracker.errors import PerftrackerError

# __NR_perf_event_open per architecture (asm/unistd.h)
_SYSCALL_NR = {"x86_64": 298, "aarch64": 241, "arm64": 241, "riscv64": 241, "ppc64le": 319, "ppc64": 319, "s390x": 331}
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_TASK_CLOCK = 1
PERF_ATTR_SIZE_VER0 = 64  # type, size, config, sample_period, sample_type, read_format, flags, wakeup, bp_type, bp_addr
PERF_FLAG_FD_CLOEXEC = 1 << 3  # keep the fd out of child processes (nsys)


class TaskClockUnavailable(PerftrackerError):
    """perf_event_open refused or unsupported here; ``errno`` is set when the kernel said why."""

    def __init__(self, message: str, err: int = 0) -> None:
        super().__init__(message)
        self.errno = err


def open_task_clock(tid: int) -> int:
    """An fd counting thread ``tid``'s on-CPU ns (pid=tid, cpu=-1, kernel time included).

    Raises TaskClockUnavailable (EACCES/EPERM: not permitted; ENOSYS/ENOENT: no perf events).
    """
    machine = platform.machine()
    nr = _SYSCALL_NR.get(machine)
    if nr is None:
        raise TaskClockUnavailable(f"perf_event_open: syscall number unknown for {machine}")
    attr = ctypes.create_string_buffer(PERF_ATTR_SIZE_VER0)  # zeroed: counting, enabled, no inherit
    struct.pack_into("IIQ", attr, 0, PERF_TYPE_SOFTWARE, PERF_ATTR_SIZE_VER0, PERF_COUNT_SW_TASK_CLOCK)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError) as exc:
        raise TaskClockUnavailable(f"perf_event_open: no libc syscall() ({exc})") from exc
    syscall.restype = ctypes.c_long
    fd = syscall(ctypes.c_long(nr), attr, ctypes.c_int(tid), ctypes.c_int(-1), ctypes.c_int(-1),
                 ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        hint = ""
        if err in (errno.EACCES, errno.EPERM):
            hint = " (needs CAP_PERFMON or perf_event_paranoid <= 1, and ptrace access to the thread)"
        raise TaskClockUnavailable(
            f"perf_event_open(task-clock, tid {tid}) failed: {errno.errorcode.get(err, err)} {os.strerror(err)}{hint}", err)
    try:
        read_task_clock(int(fd))
    except OSError as exc:
        os.close(int(fd))
        raise TaskClockUnavailable(f"perf_event_open(task-clock, tid {tid}): read failed ({exc})", exc.errno or 0) from exc
    return int(fd)


def read_task_clock(fd: int) -> int:
    """The counter's value: the thread's cumulative on-CPU ns since the fd was opened."""
    data = os.read(fd, 8)
    if len(data) != 8:
        raise OSError(errno.EIO, f"short read from perf fd ({len(data)} bytes)")
    return struct.unpack("Q", data)[0]
