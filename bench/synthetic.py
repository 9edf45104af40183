"""Synthetic patterns of a large GPU training job, with the paper's fault cases, for tests and bench.

The clean job: 20 functions typical of LLM training (GEMM and attention kernels, elementwise ops,
copies, NCCL collectives, a little Python). Per-worker noise follows what 20-second windows of real
jobs show: β varies by 1.5–3% (kernels) to 4–5% (copies, collectives) between workers, partly
shared by the 8 GPUs of a host, μ by 1.5–4% and σ by 5% of their values (averages over thousands of
executions and utilization samples in the window); Python functions, far below 1% of the window,
vary by 20–50%. Faults change the time shares the way
a synchronous job does: a slower worker stretches everybody's iteration, and the others wait for it
in the data-parallel AllReduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from perftracker.localizer.diagnose.method.arrays import FunctionInfo, PatternArrays

from perftracker.model import Category, Pattern, PatternSet

C, M, X, P = Category.COMPUTE, Category.MEMORY, Category.COLLECTIVE, Category.PYTHON
_DL = ("train.py:main;torch/utils/data/dataloader.py:__next__;torch/utils/data/dataloader.py:_next_data;"
       "multiprocessing/queues.py:get;multiprocessing/connection.py:recv_bytes;socket.py:recv_into")


@dataclass(frozen=True)
class SimFunction:
    key: str
    label: str
    category: Category
    resource: str
    beta: float
    mu: float
    sigma: float
    beta_cv: float  # relative per-worker variation of β
    mu_cv: float  # relative per-worker variation of μ
    sigma_cv: float = 0.05  # relative per-worker variation of σ


GPU_FUNCTIONS: tuple[SimFunction, ...] = (
    SimFunction("sm90_xmma_gemm_bf16bf16_bf16f32", "GEMM", C, "sm", 0.34, 0.86, 0.06, 0.015, 0.015),
    SimFunction("flash_fwd_kernel", "flash_fwd_kernel", C, "sm", 0.11, 0.80, 0.07, 0.02, 0.02),
    SimFunction("flash_bwd_dq_dk_dv_loop_kernel", "flash_bwd_kernel", C, "sm", 0.14, 0.78, 0.07, 0.02, 0.02),
    SimFunction("vectorized_elementwise_kernel", "elementwise", C, "sm", 0.05, 0.45, 0.15, 0.03, 0.03),
    SimFunction("layer_norm_fwd_kernel", "layer_norm", C, "sm", 0.025, 0.52, 0.12, 0.03, 0.03),
    SimFunction("softmax_warp_forward", "softmax", C, "sm", 0.012, 0.50, 0.12, 0.03, 0.03),
    SimFunction("multi_tensor_apply_kernel", "adam (multi_tensor_apply)", C, "sm", 0.03, 0.58, 0.10, 0.03, 0.03),
    SimFunction("Memcpy HtoD (Pinned -> Device)", "Memcpy HtoD", M, "pcie", 0.008, 0.35, 0.10, 0.04, 0.04),
    SimFunction("Memcpy PtoP (Device -> Device)", "Memcpy PtoP", M, "pcie", 0.02, 0.06, 0.03, 0.04, 0.04),
    SimFunction("Memset (Device)", "Memset", M, "hbm", 0.004, 0.10, 0.05, 0.05, 0.04),
    SimFunction("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "AllReduce", X, "nic", 0.07, 0.55, 0.15, 0.05, 0.04),
    SimFunction("ncclDevKernel_AllGather_RING_LL", "AllGather", X, "nvlink", 0.045, 0.62, 0.12, 0.04, 0.03),
    SimFunction("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "ReduceScatter", X, "nvlink", 0.04, 0.60, 0.12,
                0.04, 0.03),
    SimFunction("ncclDevKernel_SendRecv", "SendRecv", X, "nic", 0.012, 0.35, 0.10, 0.05, 0.04),
    SimFunction(_DL, "socket.recv_into", P, "cpu", 0.002, 0.15, 0.05, 0.3, 0.03),
    SimFunction("train.py:main;torch/optim/optimizer.py:step;torch/optim/adamw.py:_multi_tensor_adamw",
                "_multi_tensor_adamw", P, "cpu", 0.003, 0.95, 0.03, 0.2, 0.02),
    SimFunction("train.py:main;trainer.py:train_step;logging/__init__.py:info", "logging.info", P, "cpu",
                0.0008, 0.9, 0.05, 0.3, 0.03),
    SimFunction("train.py:main;torch/cuda/__init__.py:synchronize", "torch.cuda.synchronize", P, "cpu",
                0.002, 0.1, 0.05, 0.3, 0.02),
    SimFunction("train.py:main;trainer.py:train_step;gc:collect", "gc.collect", P, "cpu", 0.0008, 0.98, 0.02,
                0.5, 0.01),
    SimFunction("train.py:main;faults.py:inject;time:sleep", "time.sleep", P, "cpu", 0.0, 0.0, 0.0, 0.0, 0.0),
)


def function_index(arr: PatternArrays, label: str) -> int:
    for f, info in enumerate(arr.functions):
        if info.label == label:
            return f
    raise KeyError(label)


def simulate_job(n_workers: int, *, seed: int = 0, functions: Sequence[SimFunction] = GPU_FUNCTIONS,
                 gpus_per_host: int = 8, job: str = "sim-job", session: str = "s-1",
                 window_s: float = 20.0, gpu: bool = True) -> PatternArrays:
    """A clean job: the base patterns with realistic per-worker and per-host noise."""
    rng = np.random.default_rng(seed)
    n_hosts = (n_workers + gpus_per_host - 1) // gpus_per_host
    host = np.arange(n_workers) // gpus_per_host
    values = np.zeros((len(functions), 3, n_workers), dtype=np.float64)
    for f, fn in enumerate(functions):
        if fn.beta == 0.0:
            continue  # a function nobody runs in a clean job
        host_factor = rng.normal(0.0, fn.beta_cv / 2, n_hosts)[host]
        worker_factor = rng.normal(0.0, fn.beta_cv * 0.87, n_workers)
        values[f, 0] = fn.beta * np.exp(host_factor + worker_factor)
        values[f, 1] = fn.mu * np.exp(rng.normal(0.0, fn.mu_cv, n_workers))
        values[f, 2] = fn.sigma * np.exp(rng.normal(0.0, fn.sigma_cv, n_workers))
    np.clip(values, 0.0, 1.0, out=values)
    infos = tuple(FunctionInfo(fn.key, fn.label, fn.category, fn.resource) for fn in functions)
    return PatternArrays(job=job, session=session, ranks=np.arange(n_workers, dtype=np.int64), functions=infos,
                         values=values, window_s=window_s, gpu=gpu, world_size=n_workers)


def _stretch(arr: PatternArrays, extra: np.ndarray, waiters: np.ndarray, wait_label: str = "AllReduce") -> None:
    """Everybody's iteration grows by ``extra`` (a share of the old iteration); ``waiters`` spend it
    waiting in ``wait_label``. Shares are renormalized to the longer iteration."""
    ar = function_index(arr, wait_label)
    arr.values[ar, 0, waiters] += extra
    arr.values[:, 0, :] /= 1.0 + extra
    np.clip(arr.values, 0.0, 1.0, out=arr.values)


def inject_throttled_compute(arr: PatternArrays, workers: np.ndarray, label: str = "GEMM",
                             beta_factor: float = 1.3, mu_factor: float = 0.6) -> None:
    """Throttled GPUs: the kernel takes longer at lower utilization; everyone else waits for them."""
    f = function_index(arr, label)
    before = arr.values[f, 0, workers].copy()
    arr.values[f, 0, workers] *= beta_factor
    arr.values[f, 1, workers] *= mu_factor
    extra = float(np.mean(arr.values[f, 0, workers] - before))
    others = np.setdiff1d(np.arange(arr.n_workers), workers)
    _stretch(arr, extra, others)


def inject_nvlink_down(arr: PatternArrays, workers: np.ndarray, pcie_workers: np.ndarray,
                       beta_factor: float = 2.0, pcie_mu: float = 0.7) -> None:
    """NVLink down in some hosts: their AllGather is slower; the GPUs whose links are down move
    peer copies to PCIe (higher PCIe utilization of Memcpy PtoP)."""
    f = function_index(arr, "AllGather")
    before = arr.values[f, 0, workers].copy()
    arr.values[f, 0, workers] *= beta_factor
    extra = float(np.mean(arr.values[f, 0, workers] - before))
    p = function_index(arr, "Memcpy PtoP")
    arr.values[p, 1, pcie_workers] = pcie_mu + 0.02 * np.sin(pcie_workers)  # a little spread
    arr.values[p, 2, pcie_workers] *= 2.0
    _stretch(arr, extra, np.setdiff1d(np.arange(arr.n_workers), workers))


def inject_slow_input(arr: PatternArrays, beta: float, seed: int = 1) -> None:
    """Every worker waits on its input pipeline (socket recv_into in the DataLoader)."""
    rng = np.random.default_rng(seed)
    f = function_index(arr, "socket.recv_into")
    extra = beta * np.exp(rng.normal(0.0, 0.05, arr.n_workers))
    arr.values[f, 0] = extra
    arr.values[f, 1] = np.clip(0.05 + rng.normal(0.0, 0.01, arr.n_workers), 0.0, 1.0)
    others = [g for g in range(len(arr.functions)) if g != f]
    arr.values[others, 0, :] *= 1.0 - extra


def inject_gc_pauses(arr: PatternArrays, fraction: float, seed: int = 2) -> np.ndarray:
    """Random garbage-collection pauses: a random subset of workers, a random number of pauses of
    random length each. Returns the affected worker columns."""
    rng = np.random.default_rng(seed)
    f = function_index(arr, "gc.collect")
    hit = np.flatnonzero(rng.random(arr.n_workers) < fraction)
    pauses = rng.poisson(1.5, hit.size) + 1
    share = np.array([rng.lognormal(np.log(0.012), 0.6, k).sum() for k in pauses])
    arr.values[f, 0, hit] = np.minimum(share, 0.5)
    return hit


def inject_sleep(arr: PatternArrays, worker: int, beta: float = 0.15) -> None:
    """An injected time.sleep that only one worker runs."""
    f = function_index(arr, "time.sleep")
    arr.values[f, :, worker] = (beta, 0.0, 0.0)
    _stretch(arr, beta, np.setdiff1d(np.arange(arr.n_workers), [worker]))


def to_pattern_sets(arr: PatternArrays) -> list[PatternSet]:
    """One PatternSet per worker; a function with (0, 0, 0) on a worker is left out of its set."""
    start_ns = 1_700_000_000_000_000_000
    end_ns = start_ns + int(arr.window_s * 1e9)
    out = []
    for w, rank in enumerate(arr.ranks.tolist()):
        pats = []
        for f, info in enumerate(arr.functions):
            b, m, s = (float(x) for x in arr.values[f, :, w])
            if b == 0.0 and m == 0.0 and s == 0.0:
                continue
            pats.append(Pattern(info.key, info.category, b, m, s, info.label, executions=100,
                                critical_ns=int(b * arr.window_s * 1e9), resource=info.resource))
        out.append(PatternSet(job=arr.job, session=arr.session, rank=rank, world_size=arr.world_size,
                              host=f"node-{rank // 8}", window_start_ns=start_ns, window_end_ns=end_ns,
                              patterns=tuple(pats), local_rank=rank % 8, gpu=arr.gpu))
    return out
