"""Out-of-process fault injectors: cgroup CPU quota, tc rate limit, a competitor process, SIGSTOP/SIGKILL.

Each injector is a context manager (or has an undo) so that the harness removes every cgroup,
qdisc and process it made, even on failure or Ctrl-C. In-script faults (sleep, busy_python, copy,
gc_stall, hang) are passed to perftracker/examples/train.py as --fault arguments instead.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from perftracker.errors import PerftrackerError

log = logging.getLogger(__name__)

CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")


class InjectError(PerftrackerError):
    pass


class CpuQuota:
    """Limit a set of processes to ``fraction`` of one CPU with a cgroup (v1 cpu or v2 cpu.max)."""

    PERIOD_US = 100_000

    def __init__(self, name: str, fraction: float) -> None:
        self.fraction = fraction
        if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
            self.path = CGROUP_V1_CPU / name
            self.v2 = False
        elif (CGROUP_V2 / "cgroup.controllers").exists():
            self.path = CGROUP_V2 / name
            self.v2 = True
        else:
            raise InjectError("no cgroup cpu controller found (v1 /sys/fs/cgroup/cpu or v2 cpu.max)")

    def __enter__(self) -> CpuQuota:
        self.path.mkdir(exist_ok=True)
        quota = max(1000, int(self.fraction * self.PERIOD_US))
        if self.v2:
            (self.path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        return self

    def add(self, pid: int) -> None:
        """Move pid and all its threads and descendants into the cgroup."""
        procs = [pid]
        try:
            procs += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            pass
        for p in procs:
            try:
                (self.path / "cgroup.procs").write_text(str(p))
            except OSError as exc:
                log.warning("could not move pid %d into %s: %s", p, self.path, exc)

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self, attempts: int = 30, pause_s: float = 0.1) -> None:
        """Move what is left to the parent and remove the cgroup. Processes that are exiting
        cannot be moved but leave on their own, so the rmdir is retried for ``attempts`` × ``pause_s``
        (a single try left cgroups behind after scenarios whose ranks were just killed)."""
        remove_cgroup(self.path, attempts, pause_s)


class MemoryLimit:
    """Limit a process's new memory to ``limit_mb`` MiB (no swap) with a memory cgroup (v1 or v2):
    a rank that then allocates without bound is ended by the OOM killer (the ``oom`` fault).
    Memory it had before it moved in stays charged to its old cgroup, so the limit counts only
    what it allocates afterwards."""

    def __init__(self, name: str, limit_mb: int) -> None:
        self.limit = int(limit_mb) * 2**20
        if (CGROUP_V1_MEMORY / "memory.limit_in_bytes").exists():
            self.path, self.v2 = CGROUP_V1_MEMORY / name, False
        elif (CGROUP_V2 / "cgroup.controllers").exists() and \
                "memory" in (CGROUP_V2 / "cgroup.subtree_control").read_text().split():
            self.path, self.v2 = CGROUP_V2 / name, True
        else:
            raise InjectError("no memory cgroup controller (v1 /sys/fs/cgroup/memory or v2 memory.max)")

    def __enter__(self) -> MemoryLimit:
        self.path.mkdir(exist_ok=True)
        if self.v2:
            (self.path / "memory.max").write_text(str(self.limit))
            swap = self.path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
        else:
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():  # memory + swap: the same limit, so no swapping past it
                memsw.write_text(str(self.limit))
        return self

    def add(self, pid: int) -> None:
        for p in [pid] + [c.pid for c in _children(pid)]:
            try:
                (self.path / "cgroup.procs").write_text(str(p))
            except OSError as exc:
                log.warning("could not move pid %d into %s: %s", p, self.path, exc)

    def __exit__(self, *exc: object) -> None:
        remove_cgroup(self.path)


def remove_cgroup(path: Path, attempts: int = 30, pause_s: float = 0.1) -> bool:
    """Empty a cgroup into its parent and rmdir it, retrying while processes exit. True if gone."""
    parent = path.parent / "cgroup.procs"
    last: OSError | None = None
    for _ in range(max(attempts, 1)):
        if not path.exists():
            return True
        try:
            for line in (path / "cgroup.procs").read_text().split():
                try:
                    parent.write_text(line)
                except OSError:
                    pass  # exiting: it leaves by itself
            path.rmdir()
            return True
        except OSError as exc:
            last = exc
            time.sleep(pause_s)
    log.warning("could not remove cgroup %s: %s", path, last)
    return False


class RateLimit:
    """A tc token-bucket rate limit on both ends of a host's link (root-side veth and eth0 inside)."""

    def __init__(self, veth_root: str, netns: str, mbit: float) -> None:
        self.veth_root, self.netns, self.mbit = veth_root, netns, mbit

    def _tc(self, ns: str | None, *args: str, check: bool = True) -> None:
        argv = (["ip", "netns", "exec", ns] if ns else []) + ["tc", *args]
        subprocess.run(argv, check=check, capture_output=True, text=True)

    def __enter__(self) -> RateLimit:
        rate = f"{self.mbit}mbit"
        for ns, dev in ((None, self.veth_root), (self.netns, "eth0")):
            self._tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "64kb", "latency", "200ms")
        return self

    def __exit__(self, *exc: object) -> None:
        for ns, dev in ((None, self.veth_root), (self.netns, "eth0")):
            self._tc(ns, "qdisc", "del", "dev", dev, "root", check=False)


class Competitor:
    """A busy process pinned to the CPU the target process runs on (the target gets pinned too)."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self.proc: subprocess.Popen[bytes] | None = None

    def pin(self, pid: int) -> None:
        for p in [pid] + [c.pid for c in _children(pid)]:
            try:
                os.sched_setaffinity(p, {self.cpu})
            except OSError:
                pass

    def __enter__(self) -> Competitor:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(self.proc.pid, {self.cpu})
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def send(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        log.warning("pid %d already gone (signal %s)", pid, sig.name)
