"""How a worker process ended, as its node agent can see it (issue 22): psutil, procfs and cgroup files.

- **Exit status**: the agent is not the worker's parent (torchrun or ``perftracker run`` is), so it
  cannot wait for it. Between its exit and its parent's ``wait`` a process is a zombie, and
  ``/proc/<pid>/stat`` field 52 (``exit_code``, Linux >= 3.5) holds its wait status, which psutil
  does not read: the agent polls for the zombie (psutil's status, and its creation time against a
  reused pid) right after the worker's socket closes, then reads that field (``watch_exit``). torchrun reaps its workers every
  ``--monitor-interval`` (0.1 s by default), so the zombie is usually there to read; a parent
  blocked in ``wait`` (``perftracker run -- python train.py``) reaps at once and the status is then
  not seen (``None``).
- **The OOM killer**: the worker's memory cgroup (``/proc/<pid>/cgroup``, looked up at registration
  and on every agent heartbeat, since a harness or an orchestrator may move it later) and its OOM
  kill counter: cgroup v2 ``memory.events`` ``oom_kill``, cgroup v1 ``memory.oom_control``
  ``oom_kill``. A worker killed by SIGKILL (or of unseen status) whose cgroup's counter went up
  since it was last read was killed by the OOM killer. The cgroup's peak and limit go into the report
  (v2 ``memory.peak``/``memory.max``, v1 ``memory.max_usage_in_bytes``/``memory.limit_in_bytes``).
- **torchrun's error file**: ``TORCHELASTIC_ERROR_FILE`` from the worker's environment
  (psutil's ``environ``, read at registration); a worker whose ``@record``-decorated entry point
  failed wrote its exception there. The path is the worker's word: the file is read only when it
  is a regular file of the worker's uid (``read_error_file``).

Every reader returns a neutral value when the file is missing or unreadable; none raises.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class ExitStatus:
    """A decoded wait status: ``kind`` "exit" (``code`` the exit status) or "signal" (``code`` the signal)."""

    kind: str
    code: int

    @property
    def failed(self) -> bool:
        return self.kind == "signal" or self.code != 0

    def describe(self) -> str:
        if self.kind == "signal":
            return f"killed by signal {self.code} ({signal_name(self.code)})"
        return f"exit status {self.code}"


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"


def decode_wait_status(status: int) -> ExitStatus:
    if os.WIFSIGNALED(status):
        return ExitStatus("signal", os.WTERMSIG(status))
    return ExitStatus("exit", os.WEXITSTATUS(status))


def exit_code_field(pid: int, proc_root: str = "/proc") -> int | None:
    """Field 52 of ``/proc/<pid>/stat`` (``exit_code``: the wait status once the process is a
    zombie), or None if unreadable."""
    try:
        with open(f"{proc_root}/{int(pid)}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
        return int(raw[raw.rindex(")") + 2:].split()[49])  # field 52 (1-based), counting from field 3
    except (OSError, ValueError, IndexError):
        return None


def zombie_status(pid: int, started: float = 0.0) -> ExitStatus | None:
    """The wait status of ``pid`` while it is a zombie, else None (alive, reaped, or another process:
    ``started`` is its creation time, ``perftracker.agent.daemon.liveness.started_at``)."""
    if pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if started and proc.create_time() != started:
                return None
            if proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return None
    except psutil.Error:
        return None
    code = exit_code_field(pid)
    return None if code is None else decode_wait_status(code)


def watch_exit(pid: int, started: float = 0.0, timeout_s: float = 0.5, poll_s: float = 0.002) -> ExitStatus | None:
    """Poll (blocking; run it in a thread) for ``pid``'s zombie and return its status; None if the
    process is still alive at the timeout or was reaped before it was seen."""
    if pid <= 0:
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        st = zombie_status(pid, started)
        if st is not None:
            return st
        if not psutil.pid_exists(pid) or time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


def is_failure(said_exited: bool, status: ExitStatus | None, oom: bool) -> bool:
    """Hang vs crash vs exit, from the agent's side: a worker that said "exited" (its atexit ran) and
    whose exit status is 0, or was not seen, or SIGINT (interrupted: Ctrl-C), ended normally; one with a nonzero status, a signal, or
    killed by the OOM killer failed; one that died without saying "exited" failed (a signal, or
    ``os._exit``), whatever status was seen. A worker still alive is neither (a hang is the
    localizer's verdict from its snapshot)."""
    if oom:
        return True
    if said_exited:
        # Ctrl-C: an uncaught KeyboardInterrupt runs atexit, then the process ends itself with SIGINT
        return status is not None and status.failed and not (status.kind == "signal" and status.code == signal.SIGINT)
    return True


# --------------------------------------------------------------------------------------------
# memory cgroup
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryCgroup:
    """A process's memory cgroup directory and its OOM kill count when it was read."""

    path: str  # "" when unknown
    v2: bool
    oom_kills: int

    def describe(self) -> str:
        peak, limit = memory_peak_limit(self)
        rel = self.path
        marker = "/sys/fs/cgroup/" + ("" if self.v2 else "memory/")
        if marker in rel:
            rel = "/" + rel.split(marker, 1)[1]
        text = f"cgroup {rel}"
        if peak:
            text += f", memory peak {_mib(peak)}"
        if limit:
            text += f" of limit {_mib(limit)}"
        return text


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def memory_cgroup(pid: int, proc_root: str = "/proc", root: Path = CGROUP_ROOT) -> MemoryCgroup | None:
    """The memory cgroup of ``pid`` (v1 ``memory`` hierarchy or v2 unified), or None. The agent must
    see the node's cgroup hierarchy: one started with ``ip netns exec`` gets a fresh sysfs with an
    empty ``/sys/fs/cgroup`` (the fault bench enters only the network namespace, with nsenter)."""
    try:
        lines = Path(f"{proc_root}/{int(pid)}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1 = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
    if v1 is not None and (root / "memory").is_dir():
        path = root / "memory" / v1.lstrip("/")
        return MemoryCgroup(str(path), False, oom_kill_count(str(path), False))
    if v2 is not None and (root / "cgroup.controllers").exists():
        path = root / v2.lstrip("/")
        return MemoryCgroup(str(path), True, oom_kill_count(str(path), True))
    return None


def _keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().lstrip("-").isdigit():
                out[k] = int(v)
    except OSError:
        pass
    return out


def oom_kill_count(path: str, v2: bool) -> int:
    """The cgroup's OOM kill counter; -1 when unreadable."""
    if not path:
        return -1
    name = "memory.events" if v2 else "memory.oom_control"
    return _keyed(Path(path) / name).get("oom_kill", -1)


def _int_file(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def memory_peak_limit(cg: MemoryCgroup) -> tuple[int, int]:
    """(peak bytes, limit bytes) of the cgroup, 0 where unknown or unlimited."""
    p = Path(cg.path)
    if cg.v2:
        return _int_file(p / "memory.peak"), _int_file(p / "memory.max")
    limit = _int_file(p / "memory.limit_in_bytes")
    return _int_file(p / "memory.max_usage_in_bytes"), (limit if limit < 2**60 else 0)


def oom_killed(cg: MemoryCgroup | None, status: ExitStatus | None) -> bool:
    """Whether the OOM killer ended the process: its cgroup's counter rose since ``cg`` was read and
    the process died of SIGKILL (or its status was not seen)."""
    if cg is None or cg.oom_kills < 0:
        return False
    if status is not None and not (status.kind == "signal" and status.code == signal.SIGKILL):
        return False
    return oom_kill_count(cg.path, cg.v2) > cg.oom_kills


# --------------------------------------------------------------------------------------------
# torchrun's error file
# --------------------------------------------------------------------------------------------


def error_file_of(pid: int) -> str:
    """``TORCHELASTIC_ERROR_FILE`` from the process's environment, or ""."""
    try:
        return str(psutil.Process(pid).environ().get("TORCHELASTIC_ERROR_FILE", ""))
    except (psutil.Error, ValueError):  # gone, not ours to read, or a bad pid
        return ""


def read_error_file(path: str, max_bytes: int = 1 << 20, owner: int | None = None) -> tuple[str, int]:
    """(message, wall ns) of a torchelastic error file, ("", 0) if absent, unreadable or not the
    worker's own (issue 46: the path comes from the worker's environment, and the agent may run as
    root): read only when it is a regular file (a FIFO would block the agent's event loop; it is
    opened non-blocking and never read unless regular; a symlink is not followed) owned by
    ``owner``, the worker's uid as the kernel gave it at registration (None: this process's uid;
    < 0: not known, nothing is read), at most ``max_bytes``."""
    uid = os.geteuid() if owner is None else owner
    if not path or uid < 0:
        return "", 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return "", 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            log.warning("not reading the worker's error file %s: %s", path[:200],
                        "not a regular file" if not stat.S_ISREG(st.st_mode) else f"owned by uid {st.st_uid}, "
                        f"not by the worker's uid {uid}")
            return "", 0
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = json.loads(fh.read(max_bytes) or b"{}")
    except (OSError, ValueError):
        return "", 0
    finally:
        if fd >= 0:
            os.close(fd)
    msg = data.get("message") if isinstance(data, dict) else None
    if isinstance(msg, dict):
        text = str(msg.get("message", ""))
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        ts = extra.get("timestamp", 0) if isinstance(extra, dict) else 0
        try:
            ns = int(ts) * 1_000_000_000
        except (TypeError, ValueError):
            ns = 0
        return text.strip().splitlines()[0][:300] if text.strip() else "", ns
    if isinstance(msg, str):
        return msg.strip()[:300], 0
    return "", 0
