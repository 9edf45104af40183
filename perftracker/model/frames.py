"""Stack frames as snapshots record them, and what they mean: user code, a library, a collective.

Pure: shared by the capture in the training process (``perftracker.runtime.hang_capture``) and the
hang and crash diagnosis in the localizer. File names arrive already normalized: library files as
``<lib>/torch/autograd/graph.py``, the standard library as ``<stdlib>/threading.py``, perftracker's
own files as ``<perftracker>/runtime/hooks.py``, user files as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from perftracker.model import Frame

LIB_PREFIX = "<lib>/"
STDLIB_PREFIX = "<stdlib>/"
SELF_PREFIX = "<perftracker>/"

# c10d / DDP function names shown in reports under a common collective name
_COLLECTIVE_NAMES = {
    "all_reduce": "allreduce",
    "all_reduce_coalesced": "allreduce",
    "all_gather": "allgather",
    "all_gather_into_tensor": "allgather",
    "all_gather_object": "allgather",
    "_all_gather_base": "allgather",
    "all_to_all": "alltoall",
    "all_to_all_single": "alltoall",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "broadcast": "broadcast",
    "broadcast_object_list": "broadcast",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "isend": "send",
    "irecv": "recv",
    "gather": "gather",
    "scatter": "scatter",
    "reduce": "reduce",
}
# wrappers that sit between user code and the collective and say nothing themselves
_WRAPPERS = {"wrapper", "_wrapper", "inner", "wrapped", "_fn", "__call__"}
COLLECTIVE_PREFIX = "c10d "


def is_user_frame(frame: Frame) -> bool:
    """True for the training script's own code (not a library, the stdlib or perftracker)."""
    return not frame.file.startswith("<")


def innermost_user_frame(stack: Sequence[Frame]) -> Frame | None:
    for fr in reversed(stack):
        if is_user_frame(fr):
            return fr
    return None


def is_collective(current_op: str) -> bool:
    return current_op.startswith(COLLECTIVE_PREFIX)


def recognise_collective(
    stack: Sequence[Frame], call: str, kernel_state: str, distributed_active: bool
) -> str:
    """``"c10d <name>"`` if the thread waits in a collective, else "".

    Only the frames inside the innermost user frame count: a rank that sleeps in its own
    ``forward`` under DDP's ``forward`` is not in a collective.
    """
    inner: list[Frame] = []
    for fr in reversed(stack):
        if is_user_frame(fr):
            break
        inner.append(fr)  # innermost first
    sleeping = not kernel_state or kernel_state.startswith(("S", "D"))
    for fr in inner:
        f = fr.file
        if f.startswith(LIB_PREFIX + "torch/distributed/") and fr.function not in _WRAPPERS:
            name = _COLLECTIVE_NAMES.get(fr.function, fr.function.lstrip("_"))
            return COLLECTIVE_PREFIX + name
        if f == LIB_PREFIX + "torch/nn/parallel/distributed.py" and fr.function not in _WRAPPERS:
            return f"{COLLECTIVE_PREFIX}{fr.function.lstrip('_')} (DDP)"
    if not distributed_active or not sleeping:
        return ""
    if inner and inner[0].file == LIB_PREFIX + "torch/autograd/graph.py" and inner[0].function.endswith(
        "run_backward"
    ):
        # the autograd engine sleeping on a futex in a distributed job: DDP's reducer waits for
        # its bucket allreduce (CPU backward itself runs on this thread, so it would be "R")
        if not kernel_state or "futex" in kernel_state:
            return COLLECTIVE_PREFIX + "allreduce (DDP backward)"
    if not inner and call.split(".")[-1] in ("wait", "wait_stream", "synchronize"):
        if not kernel_state or "futex" in kernel_state:
            return COLLECTIVE_PREFIX + "wait (async work)"
    return ""
