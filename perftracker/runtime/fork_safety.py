"""May this training process fork a conversion child? (issue 30: the default window writer)

The window's result is converted in a forked child by default (``PERFTRACKER_WINDOW_WRITER=fork``,
perftracker/runtime/window/writer.py): torch's ``_ProfilerResult.events()`` is one C++ call that
holds the GIL for seconds (its pybind binding releases nothing), and in a writer thread it blocks
training and the interpreter's exit for that long. Forking has one hazard that can corrupt data
silently instead of failing: **RDMA memory registered without fork protection.** The HCA DMAs to
the physical pages pinned at registration; after a fork the parent's pages are copy-on-write, and
the parent's next write to one moves it to a new page that the HCA no longer sees.

Fork protection exists in two forms, and ``ibv_is_fork_initialized()`` (rdma-core, in every
libibverbs that has it) says which applies:

- ``IBV_FORK_ENABLED``: ``ibv_fork_init()`` was called (or ``RDMAV_FORK_SAFE``/``IBV_FORK_SAFE`` is
  set): every registered region is ``madvise(MADV_DONTFORK)``, absent from the child. NCCL's IB
  transport calls ``ibv_fork_init()`` in ``ncclIbInit`` before it registers anything.
- ``IBV_FORK_UNNEEDED``: the kernel (5.12+) copies DMA-pinned pages into the child at fork time, so
  the parent keeps its pages.
- ``IBV_FORK_DISABLED``: neither: a fork may corrupt RDMA buffers. The window then converts in a
  thread, as before.

A process that has not loaded libibverbs registers no RDMA memory; one whose libibverbs lacks
``ibv_is_fork_initialized`` (rdma-core before v32, 2020) cannot say, and is treated as unsafe. The
child never calls CUDA (as a ``DataLoader`` worker forked from a CUDA process): it reads only the
profiler result's host memory. Not verified on GPU or RDMA hardware.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

# enum ibv_fork_status (infiniband/verbs.h)
IBV_FORK_DISABLED, IBV_FORK_ENABLED, IBV_FORK_UNNEEDED = 0, 1, 2
_STATUS = {IBV_FORK_DISABLED: "disabled", IBV_FORK_ENABLED: "enabled", IBV_FORK_UNNEEDED: "unneeded"}


def loaded_libibverbs(maps: str) -> str | None:
    """The path of the libibverbs mapped in a process, from its ``/proc/<pid>/maps`` text; None if none."""
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and "/libibverbs.so" in parts[5]:
            return parts[5].strip()
    return None


def fork_unsafe_reason(status: int | None, lib: str | None) -> str:
    """Why a fork is unsafe for RDMA, from libibverbs' answer (``status``: None when it cannot
    answer); "" when it is safe. Pure."""
    if lib is None:
        return ""
    if status is None:
        return f"{lib} is loaded and cannot tell whether RDMA memory is fork-protected (no ibv_is_fork_initialized)"
    if status == IBV_FORK_DISABLED:
        return ("RDMA memory may be registered without fork protection (ibv_is_fork_initialized() = disabled; "
                "set RDMAV_FORK_SAFE=1 or use a kernel with copy-on-fork for pinned pages)")
    if status in (IBV_FORK_ENABLED, IBV_FORK_UNNEEDED):
        return ""
    return f"ibv_is_fork_initialized() returned an unknown status {status}"


def _fork_status(lib: str) -> int | None:
    """Ask the already-loaded libibverbs; None when it has no ``ibv_is_fork_initialized``."""
    try:
        fn = ctypes.CDLL(lib, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).ibv_is_fork_initialized
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return int(fn())


def fork_unsafe(maps_path: Path = Path("/proc/self/maps")) -> str:
    """"" when this process may fork a conversion child, else why not (logged by the caller).
    Reads this process's maps (a few ms in a large process); call it off the training thread."""
    if not hasattr(os, "fork"):
        return "os.fork is not available"
    try:
        lib = loaded_libibverbs(maps_path.read_text())
    except OSError as exc:
        return f"cannot read {maps_path} ({exc}) to check for RDMA memory"
    if lib is None:
        return ""
    return fork_unsafe_reason(_fork_status(lib), lib)
