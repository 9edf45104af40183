"""The one category rule table (perftracker.agent.summarize.categories), GPU and CPU-only columns."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.agent.summarize import categories as c

from perftracker.model.raw_window import EventKind as K

CASES = [
    # kind, name, role on a GPU window, role on a CPU-only window
    (K.KERNEL, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", c.COLLECTIVE, c.COLLECTIVE),
    (K.KERNEL, "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", c.COLLECTIVE,
     c.COLLECTIVE),
    (K.KERNEL, "volta_sgemm_128x32_nt", c.COMPUTE, c.COMPUTE),
    (K.MEMCPY, "Memcpy HtoD (Pinned -> Device)", c.MEMORY, c.MEMORY),
    (K.MEMSET, "Memset (Device)", c.MEMORY, c.MEMORY),
    (K.RUNTIME, "cudaMalloc", c.MEMORY, c.MEMORY),
    (K.RUNTIME, "cudaLaunchKernel", c.SKIP, c.SKIP),
    (K.CPU_OP, "aten::addmm", c.HOST, c.COMPUTE),
    (K.CPU_OP, "autograd::engine::evaluate_function: AddmmBackward0", c.HOST, c.COMPUTE),
    (K.CPU_OP, "MmBackward0", c.HOST, c.COMPUTE),
    (K.CPU_OP, "torch::autograd::AccumulateGrad", c.HOST, c.COMPUTE),
    (K.CPU_OP, "UndefinedGradBackward", c.HOST, c.COMPUTE),
    # a Python torch.autograd.Function's node (torch names it <Function>Backward): Python code
    (K.CPU_OP, "SlowBackwardBackward", c.HOST, c.PYTHON),
    (K.CPU_OP, "autograd::engine::evaluate_function: CheckpointFunctionBackward", c.HOST, c.PYTHON),
    (K.CPU_OP, "aten::copy_", c.HOST, c.MEMORY),
    (K.CPU_OP, "aten::empty_strided", c.HOST, c.MEMORY),
    (K.CPU_OP, "aten::fill_", c.HOST, c.MEMORY),
    (K.CPU_OP, "torch.distributed.ddp.reducer::copy_bucket_to_grad", c.HOST, c.MEMORY),
    (K.CPU_OP, "c10d::allreduce_", c.HOST, c.COLLECTIVE),
    (K.CPU_OP, "gloo:all_reduce", c.HOST, c.COLLECTIVE),
    (K.CPU_OP, "record_param_comms", c.HOST, c.COLLECTIVE),
    (K.PYTHON, "train.py(12): step", c.PYTHON, c.PYTHON),
    (K.PYTHON, "torch/distributed/distributed_c10d.py(2501): all_reduce", c.PYTHON, c.COLLECTIVE),
    (K.PYTHON, "<method 'wait' of 'torch._C._distributed_c10d.Work' objects>", c.PYTHON, c.COLLECTIVE),
    # torch 2.13's Python tracer names c10d's bound methods after pybind11 (a gloo p2p blocks in them)
    (K.PYTHON, "<built-in method recv of pybind11_builtins.pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx"
     "_use_cxx11_abi_1 object>", c.PYTHON, c.COLLECTIVE),
    (K.PYTHON, "<built-in method send of pybind11_builtins.pybind11_detail_function_record_v1 object>", c.PYTHON,
     c.COLLECTIVE),
    (K.PYTHON, "<built-in method wait of pybind11_builtins.pybind11_detail_function_record_v1 object>", c.PYTHON,
     c.COLLECTIVE),
    # its twins: a socket's recv is I/O (Python), not a collective
    (K.PYTHON, "<built-in method recv_into of _socket.socket object>", c.PYTHON, c.PYTHON),
    (K.PYTHON, "<built-in method recv of _socket.socket object>", c.PYTHON, c.PYTHON),
    (K.GC, "Python GC", c.PYTHON, c.PYTHON),
    (K.ANNOTATION, "## forward ##", c.HOST, c.SKIP),
    (K.ANNOTATION, "ProfilerStep#10", c.SKIP, c.SKIP),
    (K.OTHER, "whatever", c.SKIP, c.SKIP),
]


@pytest.mark.parametrize("kind,name,gpu_role,cpu_role", CASES)
def test_rule_table(kind: K, name: str, gpu_role: int, cpu_role: int) -> None:
    assert c.role_of(kind, name, gpu=True) == gpu_role
    assert c.role_of(kind, name, gpu=False) == cpu_role


def test_classify_matches_role_of_per_event() -> None:
    names = tuple(n for _, n, _, _ in CASES)
    kinds = np.array([int(k) for k, _, _, _ in CASES] * 3, dtype=np.uint8)
    ids = np.array(list(range(len(CASES))) * 3, dtype=np.int32)
    for gpu in (True, False):
        got = c.classify(kinds, ids, names, gpu)
        want = [c.role_of(k, n, gpu) for k, n, _, _ in CASES] * 3
        assert got.tolist() == want


def test_priorities_follow_the_model() -> None:
    assert [cat.priority for cat in c.CATEGORY_OF_LEVEL] == [0, 1, 2, 3]


def test_normalize_name_drops_addresses() -> None:
    a = "<built-in method run_backward of torch._C._EngineBase object at 0x7f9b5c9a7ba0>"
    assert c.normalize_name(a) == "<built-in method run_backward of torch._C._EngineBase object>"
