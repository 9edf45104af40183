"""Who this training process is: job, rank, world size, local rank, host, pid, training thread.

Two stages (issue 16):

1. ``provisional_identity`` at import: from torchrun's environment when it is there, else rank 0 of
   a one-process job named after the script. It is a guess (``settled`` False): a process that
   Lightning or ``torch.multiprocessing.spawn`` starts learns its rank only later, and the parent of
   an ``mp.spawn`` job never trains at all. Nothing is registered with the node agent under a guess.
2. ``settle_identity`` (called by the channel thread, never by the training thread) turns it into
   the real one, once:

   - ``torch.distributed`` is initialized: rank and world size come from the default process
     group. Rank 0 picks the job id (``job_for_rank0``) and publishes it in the default store under
     ``perftracker/job``; every other rank reads it from there (bounded wait), so all ranks agree
     without relying on torchrun's environment. The local rank is ``LOCAL_RANK`` when set, else
     counted from the hosts the ranks publish in the store (``perftracker/host/<rank>``).
   - or the process trains (at least one optimizer step) without a process group: a
     single-process job (rank 0 of 1, or torchrun's ranks for a job that never forms a group).

Job ids are sanitized to what the localizer accepts (``sanitize_job``): ``train v2.py`` becomes
``train_v2``.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import socket
import sys
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

log = logging.getLogger(__name__)

JOB_KEY = "perftracker/job"
HOST_KEY = "perftracker/host/"
MAX_JOB_CHARS = 200  # localizer/service/validate.py MAX_NAME_CHARS
_BAD = re.compile(r"[^A-Za-z0-9_.:@+=-]+")  # the localizer's name set, less "/" (job ids name files too)


@dataclass(frozen=True)
class RuntimeIdentity:
    rank: int
    world_size: int
    local_rank: int
    host: str
    pid: int
    training_tid: int
    job: str
    settled: bool = True  # False: a guess from the environment; the agent hears nothing under it
    source: str = "given"  # "env" | "process group" | "single process" | "given"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def sanitize_job(job: str) -> str:
    """A job id the localizer accepts: runs of other characters become one "_", at most 200 chars."""
    safe = _BAD.sub("_", job.strip()).strip("_")
    return safe[:MAX_JOB_CHARS] or "job"


def _script_name() -> str:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if script in ("-c", "-m", ""):
        return "python"
    return os.path.splitext(script)[0] or "python"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        log.warning("perftracker: ignoring non-integer %s=%r", name, env.get(name))
        return default


def base_job(config_job_id: str, env: Mapping[str, str]) -> str:
    """The job id without a per-run suffix: PERFTRACKER_JOB_ID, TORCHELASTIC_RUN_ID, or the script."""
    job = config_job_id or env.get("TORCHELASTIC_RUN_ID", "")
    if job and job != "none":
        return job
    return ""


def job_for_rank0(config_job_id: str, env: Mapping[str, str], distributed: bool) -> str:
    """The job id rank 0 publishes. A distributed job without a configured id is the script name plus
    the rendezvous port (two concurrent runs of one script on a node differ in it), else the pid."""
    job = base_job(config_job_id, env)
    if not job:
        job = _script_name()
        if distributed:
            port = env.get("MASTER_PORT", "")
            job = f"{job}-{port}" if port else f"{job}-{os.getpid()}"
    return sanitize_job(job)


def provisional_identity(config_job_id: str, environ: Mapping[str, str] | None = None) -> RuntimeIdentity:
    """The identity at import (see the module doc): a guess unless nothing can change it later."""
    env = os.environ if environ is None else environ
    distributed = "MASTER_PORT" in env or ("RANK" in env and "WORLD_SIZE" in env)
    return RuntimeIdentity(
        rank=_int(env, "RANK", 0),
        world_size=_int(env, "WORLD_SIZE", 1),
        local_rank=_int(env, "LOCAL_RANK", 0),
        host=socket.gethostname(),
        pid=os.getpid(),
        training_tid=threading.main_thread().native_id or threading.get_native_id(),
        job=job_for_rank0(config_job_id, env, distributed),
        settled=False,
        source="env",
    )


def _dist() -> Any:
    """torch.distributed if it is initialized in this process, else None (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # noqa: BLE001 - a torch without distributed support
        return None
    return None


def default_store() -> Any:
    """The default process group's store, or None (never imports torch)."""
    if _dist() is None:
        return None
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception as exc:  # noqa: BLE001 - e.g. a process group without a store
        log.debug("perftracker: no default store: %r", exc)
        return None


def _store_get(store: Any, key: str, timeout_s: float) -> str | None:
    try:
        store.wait([key], datetime.timedelta(seconds=timeout_s))
        return bytes(store.get(key)).decode("utf-8", "replace")
    except Exception as exc:  # noqa: BLE001 - a timeout, or a store that went away
        log.debug("perftracker: store key %s not available: %r", key, exc)
        return None


def _from_process_group(ident: RuntimeIdentity, dist: Any, config_job_id: str, env: Mapping[str, str],
                        store_wait_s: float) -> RuntimeIdentity:
    rank = int(dist.get_rank())
    world = int(dist.get_world_size())
    store = default_store()
    job = ""
    if rank == 0:
        job = job_for_rank0(config_job_id, env, world > 1)
        if store is not None:
            try:
                store.set(JOB_KEY, job)
            except Exception as exc:  # noqa: BLE001
                log.debug("perftracker: could not publish the job id: %r", exc)
    elif store is not None:
        job = _store_get(store, JOB_KEY, store_wait_s) or ""
    if not job:  # rank 0 never published (perftracker off there): the same rule, locally
        job = job_for_rank0(config_job_id, env, world > 1)
        log.info("perftracker: rank %d: no job id from rank 0; using %r", rank, job)
    local_rank = _int(env, "LOCAL_RANK", -1)
    if local_rank < 0:
        local_rank = _local_rank_from_store(store, rank, world, ident.host, store_wait_s)
    return replace(ident, rank=rank, world_size=world, local_rank=local_rank, job=sanitize_job(job),
                   settled=True, source="process group")


def _local_rank_from_store(store: Any, rank: int, world: int, host: str, wait_s: float) -> int:
    """How many lower ranks run on this host (each rank publishes its host); rank if unknown."""
    if store is None:
        return rank
    try:
        store.set(f"{HOST_KEY}{rank}", host)
    except Exception:  # noqa: BLE001
        return rank
    local = 0
    for r in range(rank):
        other = _store_get(store, f"{HOST_KEY}{r}", wait_s)
        if other is None:
            return rank
        local += other == host
    return local


def settle_identity(ident: RuntimeIdentity, config_job_id: str, iteration: int,
                    environ: Mapping[str, str] | None = None, store_wait_s: float = 30.0,
                    exiting: bool = False) -> RuntimeIdentity | None:
    """The settled identity, or None while the process cannot tell yet (see the module doc).

    ``exiting``: the process is ending with an uncaught exception before it trained (a crash at
    setup, issue 22): it settles as if it had trained, so that the crash is reported.

    Blocks up to ``store_wait_s`` on the default store: call it from a background thread."""
    if ident.settled:
        return ident
    env = os.environ if environ is None else environ
    dist = _dist()
    if dist is not None:
        return _from_process_group(ident, dist, config_job_id, env, store_wait_s)
    if iteration < 1 and not exiting:
        return None  # not training yet: maybe a launcher, a DataLoader worker, or before init_process_group
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun's ranks, but no process group
        return replace(provisional_identity(config_job_id, env), training_tid=ident.training_tid,
                       settled=True, source="env")
    return replace(ident, rank=0, world_size=1, local_rank=0, job=job_for_rank0(config_job_id, env, False),
                   settled=True, source="single process")
