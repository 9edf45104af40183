"""The one category rule table: which events are critical-path functions, and of which category.

docs/design.md section 5 fixes four categories, in priority order compute > memory > collective >
python, and gives each a GPU-trace meaning and a CPU-only meaning. ``RULES`` below is that table;
the first rule whose kinds and name pattern match decides. A rule names a *role* for a GPU window
(the window has kernels) and for a CPU-only window:

- a ``Category`` value: the event is a function of that category (its self time counts);
- ``HOST``: host-side CPU work on a GPU window. It is transparent (counted as self time of the
  enclosing Python function) when the window has Python events on the training thread, and it
  becomes a python-category frame of its own when there are none (traces recorded without
  ``with_stack``, such as the dlrm reference traces);
- ``SKIP``: not a function (annotations, CUDA runtime calls, flows); its time goes to whatever
  encloses it.

Classification runs once per distinct (kind, name), never per event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perftracker.model import Category
from perftracker.model.raw_window import EventKind

# role codes, stored as int8 per event: 0..3 are Category priorities
COMPUTE, MEMORY, COLLECTIVE, PYTHON = 0, 1, 2, 3
HOST = 4
SKIP = -1
N_LEVELS = 4

CATEGORY_OF_LEVEL: tuple[Category, ...] = (Category.COMPUTE, Category.MEMORY, Category.COLLECTIVE, Category.PYTHON)

_K = EventKind


@dataclass(frozen=True)
class Rule:
    kinds: frozenset[int]
    pattern: re.Pattern[str]
    gpu: int  # role on a window with GPU kernels
    cpu: int  # role on a CPU-only window
    why: str


def _rule(kinds: tuple[EventKind, ...], pattern: str, gpu: int, cpu: int, why: str) -> Rule:
    return Rule(frozenset(int(k) for k in kinds), re.compile(pattern), gpu, cpu, why)


_COLLECTIVE_OP = r"^(c10d::|c10d_functional::|_c10d_functional::|gloo:|nccl:|record_param_comms$|ProcessGroup)"
_MEMORY_OP = (
    r"^(aten::(copy_|_copy_from|_copy_from_and_resize|_to_copy|to|clone|contiguous|fill_|zero_|zeros|"
    r"zeros_like|ones|ones_like|full|full_like|empty|empty_like|empty_strided|new_empty|new_empty_strided|"
    r"new_zeros|resize_|set_|_pin_memory|pin_memory|cat|index_copy_|masked_fill_)$|.*reducer::copy_bucket_to_grad$)"
)
# The autograd node of a Python ``torch.autograd.Function``: torch names its class ``<Function>Backward``
# (torch/autograd/function.py, FunctionMeta), while the C++ nodes torch generates end in a digit
# (``MmBackward0``). Its self time is the user's Python backward, so on a CPU window it is Python.
_PY_AUTOGRAD_NODE = r"^(autograd::engine::evaluate_function: )?(?!UndefinedGradBackward$)[A-Za-z_]\w*Backward$"
# Python frames that are a c10d wait: the thread is blocked in a collective, or in a blocking
# point-to-point transfer (a pipeline stage's send/recv: gloo waits inside ``send``/``recv``);
# torch 2.13's Python tracer names c10d's ``Work.wait`` "<built-in method wait of pybind11...>" and the
# process group's blocking ``send``/``recv`` (gloo) "<built-in method recv of pybind11...>"
_COLLECTIVE_PY = r"(distributed_c10d\.py\(\d+\): (wait|barrier|all_reduce|all_gather|reduce_scatter|broadcast|all_to_all|send|recv|isend|irecv|batch_isend_irecv)|Work objects?>$|method 'wait' of 'torch\._C\._distributed_c10d|^<built-in method (wait|send|recv) of pybind11)"

# torch.distributed.pipelining's wait for a stage's batched send/recv (issue 31): the schedule calls
# ``work.wait()`` from here, and on gloo the C call is not recorded, so the wait is this frame's self time
_PIPELINE_WAIT_PY = r"pipelining/schedules\.py\(\d+\): _wait_batch_p2p$"

RULES: tuple[Rule, ...] = (
    _rule((_K.KERNEL,), r"^(nccl|ncclDevKernel_|ncclKernel_)", COLLECTIVE, COLLECTIVE, "NCCL kernels"),
    _rule((_K.KERNEL,), r"", COMPUTE, COMPUTE, "every other kernel"),
    _rule((_K.MEMCPY, _K.MEMSET), r"", MEMORY, MEMORY, "gpu_memcpy / gpu_memset"),
    _rule((_K.RUNTIME,), r"^(cudaMalloc|cudaFree|cudaHostAlloc|cudaMallocHost|cudaFreeHost|cuMemAlloc|cuMemFree)",
          MEMORY, MEMORY, "allocator calls"),
    _rule((_K.RUNTIME,), r"", SKIP, SKIP, "other CUDA runtime/driver calls: launch overhead of the enclosing frame"),
    _rule((_K.CPU_OP,), _COLLECTIVE_OP, HOST, COLLECTIVE, "c10d / gloo / nccl ops (on GPU the NCCL kernel carries it)"),
    _rule((_K.CPU_OP,), _MEMORY_OP, HOST, MEMORY, "copy / fill / alloc aten ops"),
    _rule((_K.CPU_OP,), _PY_AUTOGRAD_NODE, HOST, PYTHON, "the node of a Python autograd.Function: its backward is Python"),
    _rule((_K.CPU_OP,), r"", HOST, COMPUTE, "every other op: aten compute, autograd nodes, reducer math"),
    _rule((_K.PYTHON,), _COLLECTIVE_PY, PYTHON, COLLECTIVE, "Python frames blocked in a c10d call"),
    _rule((_K.PYTHON,), _PIPELINE_WAIT_PY, PYTHON, COLLECTIVE, "a pipeline stage waiting for its send/recv"),
    _rule((_K.PYTHON,), r"", PYTHON, PYTHON, "Python functions (training thread, self time)"),
    _rule((_K.GC,), r"", PYTHON, PYTHON, "'Python GC' events: a function of their own"),
    _rule((_K.ANNOTATION,), r"^ProfilerStep#", SKIP, SKIP, "step markers: not a function"),
    _rule((_K.ANNOTATION,), r"", HOST, SKIP, "user annotations / ProfilerStep#: transparent"),
    _rule((_K.OTHER,), r"", SKIP, SKIP, "everything else"),
)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def normalize_name(name: str) -> str:
    """Drop per-process object addresses, so that the same function has one name on every rank."""
    return _ADDRESS.sub("", name)


def role_of(kind: int, name: str, gpu: bool) -> int:
    """The role (a level 0..3, HOST or SKIP) of one (kind, name)."""
    for rule in RULES:
        if int(kind) in rule.kinds and rule.pattern.search(name):
            return rule.gpu if gpu else rule.cpu
    return SKIP


def classify(kind: np.ndarray, name_id: np.ndarray, names: tuple[str, ...], gpu: bool) -> np.ndarray:
    """Role per event (int8), evaluating the table once per distinct (kind, name_id)."""
    if len(kind) == 0:
        return np.zeros(0, dtype=np.int8)
    pair = kind.astype(np.int64) * (len(names) + 1) + name_id.astype(np.int64)
    uniq, inverse = np.unique(pair, return_inverse=True)
    roles = np.empty(len(uniq), dtype=np.int8)
    for i, p in enumerate(uniq.tolist()):
        k, n = divmod(p, len(names) + 1)
        roles[i] = role_of(k, names[n] if 0 <= n < len(names) else "", gpu)
    return roles[inverse.reshape(-1)]
