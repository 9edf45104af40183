"""Host-bound GPU jobs: one finding, "the GPU waits for the host", not one per host op.

On a GPU window the critical path reaches the host only while no kernel, copy or collective runs:
the GPU is idle, waiting for the CPU to launch more work. The summarizer puts that host time in the
python category: self time of Python frames where the trace has Python stacks, and otherwise the
host ops themselves (``aten::mm``, ``## forward ##`` annotations, ``DistributedDataParallel.forward``),
since a trace recorded without stacks has nothing else to name (agent/summarize/categories.py, role HOST).

Those host ops are dispatch, not Python, and a job with a slow host spreads its time over dozens
of them: judging each against the paper's 1% Python bound gave a dozen findings on the dlrm traces,
one per op. Here they are summed per worker into one function, ``GPU waits for the host``, judged
against its own expected range (``expected.toml``, gpu profile); the report lists the top host
functions inside it. A single host op gets a finding of its own only when it alone exceeds that
range, or when the differential test singles out some workers' share of it (one rank's host stall).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from perftracker.localizer.diagnose.method.arrays import FunctionInfo, PatternArrays

from perftracker.model import LINK_KEY, Category
from perftracker.model.hardware import is_health

HOST_KEY = "host:GPU waits for the host"
HOST_LABEL = "GPU waits for the host"
IDLE_KEY = "host:nothing on the critical path"
IDLE_LABEL = "stall outside traced ops"  # one name for the cause (issue 47); the key keeps its old words
# a Python frame in a function key: "/path/file.py(123): fn" (stack sampler, Kineto python_function),
# "file.py:fn" (synthetic and hand-built stacks), or a C builtin called from Python
_PY_FRAME = re.compile(r"\.py(\(\d+\)|:)|<built-in ")
_NOT_DISPATCH = re.compile(r"^(Python GC|CPU wait \(runnable, no core\))$")


def is_host_op(key: str, label: str, category: Category) -> bool:
    """A python-category function that is a host op (dispatch, annotation), not a Python frame."""
    return (category is Category.PYTHON and key not in (HOST_KEY, IDLE_KEY) and not _PY_FRAME.search(key)
            and not _NOT_DISPATCH.match(label))


def host_dispatch_functions(arr: PatternArrays) -> list[int]:
    """Indices of the python-category functions of a GPU window that are host ops, not Python frames."""
    if not arr.gpu:
        return []
    return [f for f, info in enumerate(arr.functions) if is_host_op(info.key, info.label, info.category)]


def beta_sum(values: np.ndarray, functions: list[int]) -> np.ndarray:
    """``values[functions, 0, :].sum(axis=0)``, the same floats (numpy adds the rows of an axis-0
    sum one after another, as here) without copying the rows first (160 MB at a million workers)."""
    if not functions:
        return np.zeros(values.shape[2])
    out: np.ndarray = values[functions[0], 0].copy()
    for f in functions[1:]:
        out += values[f, 0]
    return out


def with_host_total(arr: PatternArrays) -> tuple[PatternArrays, list[int]]:
    """(arr with one more function, the per-worker sum of the host ops' β, μ = σ = 0; their indices).
    arr itself when the window has no host ops."""
    host = host_dispatch_functions(arr)
    if not host or any(info.key == HOST_KEY for info in arr.functions):
        return arr, host
    total = np.zeros((1, 3, arr.n_workers))
    total[0, 0] = np.minimum(beta_sum(arr.values, host), 1.0)
    info = FunctionInfo(HOST_KEY, HOST_LABEL, Category.PYTHON, "")
    return replace(arr, functions=arr.functions + (info,), values=np.concatenate([arr.values, total])), host


def with_idle_share(arr: PatternArrays) -> tuple[PatternArrays, int | None]:
    """arr with one more function on a GPU window: the share of each worker's window in which no
    function held the critical path (no kernel, copy or collective ran and the host recorded
    nothing: a host thread that sleeps, blocks or works outside the traced ops), and its index.

    It is never a finding by itself (how much of a window is untraced varies with the trace); it is
    a candidate cause when a rank arrives late and none of its functions explains it (a host stall).
    """
    if not arr.gpu or any(info.key == IDLE_KEY for info in arr.functions):
        return arr, None
    own = [f for f, info in enumerate(arr.functions) if info.key not in (HOST_KEY, LINK_KEY) and not is_health(info.key)]
    idle = np.zeros((1, 3, arr.n_workers))
    idle[0, 0] = np.clip(1.0 - beta_sum(arr.values, own), 0.0, 1.0)
    info = FunctionInfo(IDLE_KEY, IDLE_LABEL, Category.PYTHON, "")
    return (replace(arr, functions=arr.functions + (info,), values=np.concatenate([arr.values, idle])),
            len(arr.functions))


def top_host_functions(arr: PatternArrays, workers: np.ndarray, n: int = 5,
                       labels: Sequence[str] | None = None) -> tuple[tuple[str, float], ...]:
    """(label, median β over ``workers``) of the n host ops that hold the most of the window;
    ``labels``: each function's label where not its own (one per call path, ``words.labels``)."""
    host = host_dispatch_functions(arr)
    if not host:
        return ()
    med = np.median(arr.values[host, 0][:, workers], axis=1)
    order = np.argsort(-med, kind="stable")[:n]
    names = [i.label for i in arr.functions] if labels is None else labels
    return tuple((names[host[i]], float(med[i])) for i in order if med[i] > 0)
