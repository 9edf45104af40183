"""Where a worker's training thread may run: its cgroup and its allowed CPUs (issue 31).

``PatternSet.cpu_place`` is ``"<cgroup>|<Cpus_allowed_list>"`` from ``/proc/<pid>/cgroup`` and the
``Cpus_allowed_list`` line of ``/proc/<pid>/task/<tid>/status`` (the training thread's; the
process's where the thread is unknown), "" where they cannot be read (the worker has exited, no
procfs). Two ranks of one host with the same place share their cores and their CPU quota: whatever
else runs there competes with both, so one rank's longer wait for a core is the scheduler's
placement, not a cause of its own (``localizer/diagnose/evidence/cpu_starvation.py``). A rank pinned to
other cores (``taskset``, a launcher's NUMA binding) or in a cgroup of its own (one container per
rank) has a place of its own, and its CPU wait is judged as before.
"""

from __future__ import annotations

from pathlib import Path

_ALLOWED = "Cpus_allowed_list:"


def cpu_place(pid: int, tid: int = 0, proc: Path = Path("/proc")) -> str:
    """The worker's CPU place, "" where it cannot be read."""
    if pid <= 0:
        return ""
    status = proc / str(pid) / ("task/" + str(tid) if tid > 0 else "") / "status"
    try:
        try:
            text = status.read_text()
        except FileNotFoundError:
            text = (proc / str(pid) / "status").read_text()
        cgroup = (proc / str(pid) / "cgroup").read_text()
    except (OSError, UnicodeDecodeError):
        return ""
    cpus = next((line[len(_ALLOWED):].strip() for line in text.splitlines() if line.startswith(_ALLOWED)), "")
    if not cpus:
        return ""
    groups = ";".join(sorted(line.strip() for line in cgroup.splitlines() if line.strip()))
    return f"{groups}|{cpus}"
