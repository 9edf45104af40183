"""Which GPU a training process uses, from what a GPU node has: NVML's per-GPU process lists, and
the process's own environment (``CUDA_VISIBLE_DEVICES``, ``LOCAL_RANK``).

The sampler process is told only the training process's pid, so its GPU samplers pick the GPU when
the window starts (by then the process has its CUDA context):

1. the GPUs whose NVML compute or graphics process list holds the pid: if exactly one, that one;
   if several (a context on GPU 0 beside its own, the usual slip of a job that calls
   ``torch.cuda.set_device`` late), the one its environment names among them when it names one
   (``LOCAL_RANK`` set, or ``CUDA_VISIBLE_DEVICES`` of one GPU), else the one where the process
   holds the most memory (a stray context holds a few hundred MB, the training the rest);
2. else (no context yet; or a container whose NVML reports host pids) the environment: the
   ``LOCAL_RANK``-th entry (modulo their number) of the GPUs ``CUDA_VISIBLE_DEVICES`` makes
   visible, entries by index or by UUID (a prefix, as CUDA takes it), all GPUs when it is unset;
   the torchrun convention ``cuda:LOCAL_RANK``. ``/proc/<pid>/environ`` is the environment the
   process started with: a ``CUDA_VISIBLE_DEVICES`` the script sets itself is not seen. CUDA numbers GPUs fastest-first unless
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML in PCI order; on a node of identical GPUs the two agree;
3. else none (``CUDA_VISIBLE_DEVICES`` empty, MIG instances): the window has no GPU series.

``pick_gpu`` is pure; ``resolve_gpu`` reads NVML and ``/proc``. NOT VERIFIED ON A MULTI-GPU NODE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuPick:
    index: int | None  # NVML index; None: no GPU for this process
    how: str  # how it was chosen, for the sampler's log


def _env_choice(environ: Mapping[str, str], uuids: Sequence[str]) -> GpuPick:
    count = len(uuids)
    visible_text = environ.get("CUDA_VISIBLE_DEVICES")
    if visible_text is None:
        visible = list(range(count))
    else:
        visible = []
        for entry in (e.strip() for e in visible_text.split(",")):
            if not entry:
                break
            if entry.lstrip("-").isdigit():
                idx = int(entry)
                if idx < 0 or idx >= count:
                    break  # CUDA stops at the first invalid entry
                visible.append(idx)
            else:
                token = entry.upper()
                match = [i for i, u in enumerate(uuids) if u.upper().startswith(token)
                         or u.upper().startswith("GPU-" + token)]
                if len(match) != 1:
                    break
                visible.append(match[0])
    if not visible:
        return GpuPick(None, f"CUDA_VISIBLE_DEVICES={visible_text!r} makes no GPU of the {count} visible")
    try:
        local = int(environ.get("LOCAL_RANK", "0"))
    except ValueError:
        local = 0
    idx = visible[max(local, 0) % len(visible)]
    return GpuPick(idx, f"LOCAL_RANK {local} of CUDA_VISIBLE_DEVICES={visible_text!r} (the environment: no NVML "
                        "process entry)" if visible_text is not None else
                   f"LOCAL_RANK {local} of {count} GPUs (the environment: no NVML process entry)")


def pick_gpu(pid: int, gpu_pids: Sequence[Mapping[int, int]], uuids: Sequence[str],
             environ: Mapping[str, str]) -> GpuPick:
    """The NVML index of the GPU process ``pid`` uses. ``gpu_pids[i]``: the processes NVML lists on
    GPU i, pid -> the bytes of GPU memory it holds there (0 unknown); ``uuids[i]``: GPU i's UUID;
    ``environ``: the process's environment ({} if unreadable)."""
    if not uuids:
        return GpuPick(None, "no GPU on this node")
    on = [i for i, pids in enumerate(gpu_pids) if pid in pids]
    by_env = _env_choice(environ, uuids) if environ else GpuPick(None, "environment unreadable")
    if len(on) == 1:
        return GpuPick(on[0], f"NVML lists pid {pid} on GPU {on[0]}")
    if len(on) > 1:
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        names_one = "LOCAL_RANK" in environ or (visible is not None and len(visible.split(",")) == 1)
        if names_one and by_env.index in on:
            return GpuPick(by_env.index, f"NVML lists pid {pid} on GPUs {on}; its environment names {by_env.index}")
        best = max(on, key=lambda i: int(gpu_pids[i].get(pid) or 0))
        return GpuPick(best, f"NVML lists pid {pid} on GPUs {on}; it holds the most memory on {best}")
    if environ:
        return by_env
    return GpuPick(None, f"pid {pid} is in no NVML process list and its environment is unreadable")


def read_environ(pid: int) -> dict[str, str]:
    """A process's environment from ``/proc/<pid>/environ`` ({} when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _pids(nv: Any, handle: Any) -> dict[int, int]:
    """pid -> GPU memory bytes (0 when NVML cannot say) of the processes on one GPU."""
    out: dict[int, int] = {}
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            for p in getattr(nv, fn)(handle):
                used = getattr(p, "usedGpuMemory", 0)
                out[int(p.pid)] = max(out.get(int(p.pid), 0), int(used) if isinstance(used, int) and used > 0 else 0)
        except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_SUPPORTED on some GPUs: that list is empty
            continue
    return out


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)  # older pynvml: bytes


def pick_by_uuid(uuid: str, uuids: Sequence[str]) -> GpuPick | None:
    """The GPU whose NVML UUID is the one the process said (``GPU-`` prefix optional); None when
    none is (a MIG instance's UUID names no whole GPU): the caller then guesses as before."""
    want = uuid.strip().upper()
    want = want if want.startswith(("GPU-", "MIG-")) else "GPU-" + want
    hit = [i for i, u in enumerate(uuids) if u.strip().upper() == want]
    return GpuPick(hit[0], f"the process's own CUDA device {uuid}") if len(hit) == 1 else None


def resolve_gpu(nv: Any, pid: int, uuid: str = "") -> GpuPick:
    """``pick_gpu`` over the live NVML (initialised) and ``/proc/<pid>/environ``; the process's own
    device UUID first, when it said one (containers: renumbered GPUs, host pids in NVML)."""
    try:
        count = int(nv.nvmlDeviceGetCount())
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
    except Exception as exc:  # noqa: BLE001
        return GpuPick(None, f"NVML could not list the GPUs: {type(exc).__name__}: {exc}")
    said = pick_by_uuid(uuid, uuids) if uuid else None
    if said is not None:
        return said
    return pick_gpu(pid, [_pids(nv, h) for h in handles], uuids, read_environ(pid))
