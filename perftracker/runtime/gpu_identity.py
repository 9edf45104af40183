"""Which GPU this training process uses, said by the process itself (issue 43, item 8).

Under Kubernetes the pod's GPUs are renumbered (``NVIDIA_VISIBLE_DEVICES``) and NVML in a container
reports host pids: the sampler's own guess (NVML process lists, ``LOCAL_RANK``) can pick a neighbour's
GPU, silently. The process knows its device: CUDA's UUID of the current device
(``torch.cuda.get_device_properties(i).uuid``, printed as 8-4-4-4-12 hex without NVML's "GPU-"
prefix; torch 2.3.1 has no ``uuid`` property, then nothing is said). Read only where this process
has initialised CUDA itself: perftracker never creates a CUDA context. The current device is per
thread (``cudaSetDevice``): call it on the training thread (``ProfileWindow.on_boundary`` does), never
from perftracker's own threads, where it names device 0 on every rank. NOT VERIFIED ON HARDWARE.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)


def own_gpu_uuid() -> str:
    """NVML's form of this process's current CUDA device's UUID ("GPU-..."), or "" when unknown."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return ""
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        uuid = getattr(props, "uuid", None)
    except Exception as exc:  # noqa: BLE001 - never into the training job
        log.debug("perftracker: no CUDA device UUID: %s", exc)
        return ""
    if uuid is None:
        return ""
    text = str(uuid).strip()
    return text if text.upper().startswith(("GPU-", "MIG-")) else f"GPU-{text}"
