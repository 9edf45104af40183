"""Event kinds where torch's ``_KinetoEvent`` has no ``activity_type()`` (torch 2.11: every window of
the H200 device check failed on it). The fallback must give what ``activity_type()`` gives."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from perftracker.runtime.profiler import _activity_without_type, _names, activities

CPU = torch.autograd.DeviceType.CPU
CUDA = torch.autograd.DeviceType.CUDA


def _work() -> None:
    x = torch.randn(64, 64)
    for _ in range(3):
        with record_function("user-region"):
            x = torch.relu(x @ x) * 1e-3


def test_the_fallback_agrees_with_activity_type_on_real_events() -> None:
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        _work()
    events = prof.profiler.kineto_results.events()
    assert len(events) > 20 and hasattr(events[0], "activity_type")
    truth = [e.activity_type() for e in events]
    assert {"cpu_op", "user_annotation", "python_function"} <= set(truth)
    names, _ = _names(list(events))  # a tracer event's name can be undecodable: read once, as the reader does
    assert [_activity_without_type(e, CPU, n) for e, n in zip(events, names, strict=True)] == truth

    class Torch211Event:  # what torch 2.11's _KinetoEvent offers of these: no is_python_function() either
        def __init__(self, e: Any) -> None:
            self.name, self.device_type, self.is_user_annotation = e.name, e.device_type, e.is_user_annotation

    assert [_activity_without_type(Torch211Event(e), CPU, n) for e, n in zip(events, names, strict=True)] == truth


class _Ev:
    """A ``_KinetoEvent`` of torch 2.11's shape: no activity_type()."""

    def __init__(self, name: str, device: Any, python: bool = False, annotation: bool = False) -> None:
        self._n, self._d, self._p, self._a = name, device, python, annotation

    def name(self) -> str:
        return self._n

    def device_type(self) -> Any:
        return self._d

    def is_python_function(self) -> bool:
        return self._p

    def is_user_annotation(self) -> bool:
        return self._a


def test_gpu_and_runtime_events_without_activity_type() -> None:
    chunk = [
        _Ev("aten::mm", CPU), _Ev("cudaLaunchKernel", CPU), _Ev("cuLaunchKernel", CPU),
        _Ev("cudaStreamSynchronize", CPU), _Ev("cudaMemcpyAsync", CPU), _Ev("aten::cudnn_convolution", CPU),
        _Ev("cuda_graph_warmup", CPU), _Ev("ProfilerStep#3", CPU, annotation=True),
        _Ev("train.py(10): step", CPU, python=True), _Ev("<frozen importlib._bootstrap>(100): acquire", CPU, python=True),
        _Ev("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(...)", CUDA),
        _Ev("Memcpy HtoD (Pageable -> Device)", CUDA), _Ev("Memset (Device)", CUDA),
        _Ev("user-region", CUDA, annotation=True),
    ]
    assert activities(chunk, CPU, [e.name() for e in chunk]) == [
        "cpu_op", "cuda_runtime", "cuda_runtime", "cuda_runtime", "cuda_runtime", "cpu_op", "cpu_op",
        "user_annotation", "python_function", "python_function", "kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"]
    # an older event without is_user_annotation either
    old = SimpleNamespace(name=lambda: "aten::add", device_type=lambda: CPU, is_python_function=lambda: False)
    assert activities([old], CPU, ["aten::add"]) == ["cpu_op"]
