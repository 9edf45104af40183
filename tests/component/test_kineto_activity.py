"""Event kinds where torch's ``_KinetoEvent`` has no ``activity_type()`` (torch 2.11: every window of
the H200 device check failed on it). The fallback must give what ``activity_type()`` gives."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
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
    if not hasattr(events[0], "activity_type"):  # torch 2.3.1: no activity_type() to compare with
        names, _ = _names(list(events))
        got = {n: _activity_without_type(e, CPU, n) for e, n in zip(events, names, strict=True)}
        assert got["user-region"] == "user_annotation" and got["aten::mm"] == "cpu_op", got
        return
    assert len(events) > 20
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


# torch 2.3.1's _ExperimentalConfig.__init__ signature, as pybind prints it (read from torch 2.3.1+cu121)
_SIG_231 = ("__init__(self: torch._C._profiler._ExperimentalConfig, profiler_metrics: list[str] = [], "
            "profiler_measure_per_kernel: bool = False, verbose: bool = False, performance_events: list[str] = [], "
            "enable_cuda_sync_events: bool = False) -> None\n\nAn experimental config for Kineto features.")


class _Config231:
    """A stand-in with torch 2.3.1's keywords: any other keyword is a TypeError, as pybind raises."""

    KEYS = {"profiler_metrics", "profiler_measure_per_kernel", "verbose", "performance_events", "enable_cuda_sync_events"}

    def __init__(self, **kw: Any) -> None:
        if set(kw) - self.KEYS:
            raise TypeError("__init__(): incompatible constructor arguments")
        self.kw = kw


_Config231.__init__.__doc__ = _SIG_231


def test_experimental_config_passes_only_what_the_torch_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.3.1 has no record_python_gc_info: passing it raised TypeError and aborted every window."""
    from perftracker.runtime import profiler as prof

    monkeypatch.setattr(prof, "_ExperimentalConfig", _Config231)
    monkeypatch.setattr(prof, "ProfilerConfig", lambda *a: a)
    with pytest.raises(TypeError):
        _Config231(record_python_gc_info=True)  # what the old code passed
    exp, taken = prof.experimental_config(record_python_gc_info=True)
    assert isinstance(exp, _Config231) and exp.kw == {} and not taken
    exp, taken = prof.experimental_config(record_python_gc_info=False)
    assert exp.kw == {} and taken
    # the window's own config: the GC then comes from gc.callbacks, not from the profile
    cap = prof.KinetoCapture(with_stack=True, record_gc=True, cuda=False)
    cap._config()
    assert cap.gc_in_profile is False
    # a signature text that cannot be read: tried as is, then without the keyword
    monkeypatch.setattr(_Config231.__init__, "__doc__", None)
    exp, taken = prof.experimental_config(record_python_gc_info=True)
    assert exp.kw == {} and not taken


def test_experimental_config_on_this_torch() -> None:
    from perftracker.runtime import profiler as prof

    accepted = prof._accepted_keywords()
    assert accepted is not None and "verbose" in accepted and "self" not in accepted
    exp, taken = prof.experimental_config(record_python_gc_info=True)
    assert taken == ("record_python_gc_info" in accepted)


class _Ev231:
    """A ``_KinetoEvent`` of torch 2.3.1's shape: start_us/duration_us, scope(), no start_ns,
    activity_type, is_user_annotation or is_python_function."""

    def __init__(self, name: str, start_us: int, dur_us: int, scope: int = 0, tid: int = 1) -> None:
        self._n, self._s, self._d, self._scope, self._tid = name, start_us, dur_us, scope, tid

    def name(self) -> str:
        return self._n

    def device_type(self) -> Any:
        return CPU

    def scope(self) -> int:
        return self._scope

    def start_us(self) -> int:
        return self._s

    def duration_us(self) -> int:
        return self._d

    def start_thread_id(self) -> int:
        return self._tid


def test_rows_from_torch_231_events() -> None:
    """µs times become ns on the same base; the marker (a user-scope event, scope 7) is found, so the
    training thread's events get its OS id."""
    from perftracker.runtime.profiler import MARKER, kineto_rows

    t0_us = 1_700_000_000_000_000
    events = [_Ev231(MARKER, t0_us, 1, scope=7, tid=4), _Ev231("aten::mm", t0_us + 10, 25, tid=4),
              _Ev231("user-region", t0_us + 5, 100, scope=7, tid=4), _Ev231("aten::add", t0_us + 50, 3, tid=9)]
    result = SimpleNamespace(events=lambda: events)
    rows = kineto_rows(result, offset_ns=0, training_tid=12345, lo_ns=0, hi_ns=2**62)
    assert rows.name == ["aten::mm", "user-region", "aten::add"]
    assert rows.start_ns.tolist() == [(t0_us + 10) * 1000, (t0_us + 5) * 1000, (t0_us + 50) * 1000]
    assert rows.end_ns.tolist() == [(t0_us + 35) * 1000, (t0_us + 105) * 1000, (t0_us + 53) * 1000]
    assert rows.tid.tolist() == [12345, 12345, -9]
    from perftracker.model.raw_window import EventKind

    assert rows.kind.tolist() == [EventKind.CPU_OP, EventKind.ANNOTATION, EventKind.CPU_OP]


class _Ev213:
    """A ``_KinetoEvent`` of torch 2.13's shape, with Kineto's activity names ("cuda_runtime", "kernel")."""

    def __init__(self, name: str, act: str, start_ns: int, dur_ns: int, device: Any = CPU) -> None:
        self._n, self._a, self._s, self._d, self._dev = name, act, start_ns, dur_ns, device

    def name(self) -> str:
        return self._n

    def activity_type(self) -> str:
        return self._a

    def start_ns(self) -> int:
        return self._s

    def end_ns(self) -> int:
        return self._s + self._d

    def start_thread_id(self) -> int:
        return 1

    def device_type(self) -> Any:
        return self._dev

    def device_resource_id(self) -> int:
        return 7  # the stream

    def device_index(self) -> int:
        return 0


def _gpu_window(kernels: bool) -> Any:
    from perftracker.runtime.profiler import MARKER

    t = 1_700_000_000_000_000_000
    ev = [_Ev213(MARKER, "user_annotation", t, 1)]
    for i in range(5):
        ev += [_Ev213("aten::mm", "cpu_op", t + i * 1000, 500), _Ev213("cudaLaunchKernel", "cuda_runtime", t + i * 1000 + 10, 5)]
        if kernels:
            ev.append(_Ev213("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", "kernel", t + i * 1000 + 20, 400, CUDA))
    ev.append(_Ev213("cudaStreamSynchronize", "cuda_runtime", t + 6000, 5))  # not a launch
    return SimpleNamespace(events=lambda: ev)


def test_a_window_with_launches_and_no_kernels_says_gpu_events_lost() -> None:
    """CUPTI lost the GPU activity (the second window after a teardown): the training thread launched
    five kernels and the profile has none. Said, never a CPU window; the twin keeps its kernels."""
    from perftracker.runtime.profiler import gpu_events_lost, kineto_rows

    lost = kineto_rows(_gpu_window(kernels=False), 0, 99, 0, 2**62)
    assert (lost.launches, lost.gpu_events) == (5, 0)
    assert gpu_events_lost(lost).startswith("GPU events lost: 5 CUDA launches")
    kept = kineto_rows(_gpu_window(kernels=True), 0, 99, 0, 2**62)
    assert (kept.launches, kept.gpu_events) == (5, 5) and gpu_events_lost(kept) == ""
    # a CPU job: no launch, nothing lost
    cpu = SimpleNamespace(events=lambda: [e for e in _gpu_window(False).events() if e.activity_type() != "cuda_runtime"])
    assert gpu_events_lost(kineto_rows(cpu, 0, 99, 0, 2**62)) == ""


def test_cupti_settings_follow_torchs_policy() -> None:
    from perftracker.runtime.profiler import cupti_env

    off = {"DISABLE_CUPTI_LAZY_REINIT": "1", "TEARDOWN_CUPTI": "0"}
    assert cupti_env("12.4", True) == off and cupti_env("11.8", True) == off
    assert cupti_env("12.6", True) == {} and cupti_env("12.8", True) == {} and cupti_env("13.0", True) == {}
    assert cupti_env("12.4", False) == {} and cupti_env(None, True) == {}  # no graphs, or a CPU build
