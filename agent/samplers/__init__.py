"""Hardware samplers: procfs (always), nvml and nsys (GPU), rdma (InfiniBand/RoCE ports); the GPU and
RDMA samplers are not verified on hardware here.

``sample_window`` runs the chosen samplers, each in its own thread, over one profile window and
returns a ``SampleSet``. ``python -m perftracker.agent.samplers`` wraps it as the sampler process.

GPU counters: only one tool may hold CUPTI or the GPU profiling counters at a time. The nsys
sampler takes a node-wide lock per GPU (``gpu_lock_dir``), yields to a running DCGM host engine,
and when nsys cannot get the counters the NVML sampler (which reads the driver's own utilization
counters, not the profiling counters) runs instead. See ``perftracker.agent.samplers.nsys``.
Where nsys runs (NGC containers ship it), NVML still samples the clocks, throttle reasons and
power beside it (``NvmlSampler(health_only=True)``, "nvml_health"): nsys reads none of them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perftracker.agent.samplers.base import Sampler, WindowBounds
from perftracker.agent.samplers.procfs import ProcfsOptions, ProcfsSampler

from perftracker.model.raw_window import SampleSet, UtilSeries

log = logging.getLogger(__name__)

GPU_OFF = -1
GPU_AUTO = -2

__all__ = ["GPU_AUTO", "GPU_OFF", "Sampler", "SamplerOptions", "WindowBounds", "build_samplers", "run_samplers", "sample_window"]


@dataclass(frozen=True)
class SamplerOptions:
    samplers: tuple[str, ...] = ("procfs", "gpu", "rdma")  # "gpu" = nsys if it can run, else nvml
    rdma_ports: tuple[str, ...] = ()  # "mlx5_0:1" (NCCL_IB_HCA's names); () = every active port
    procfs: ProcfsOptions = ProcfsOptions()
    gpu_index: int = GPU_AUTO  # an NVML index; GPU_OFF: no GPU sampling; GPU_AUTO: the GPU the process uses
    # (perftracker.agent.samplers.gpu_pick, at the window's start)
    gpu_uuid: str = ""  # the process's own CUDA device (perftracker/runtime/gpu_identity.py): beats the auto pick
    nsys_frequency_hz: int = 10_000
    gpu_lock_dir: str = "/tmp"


def build_samplers(pid: int, tid: int, options: SamplerOptions) -> list[Sampler]:
    """The samplers that can run here, in order; GPU samplers fall back nsys -> nvml."""
    out: list[Sampler] = []
    gpu_bus = ""  # the GPU's PCI bus id once NVML picked it: the RDMA sampler takes the NIC nearest it
    for name in options.samplers:
        candidates: list[Sampler] = []
        if name == "procfs":
            candidates = [ProcfsSampler(pid, tid, options.procfs)]
        elif name == "rdma":  # after procfs: its NIC series replaces /proc/net/dev's (RDMA bypasses the kernel)
            from perftracker.agent.samplers.rdma import RdmaSampler

            candidates = [RdmaSampler(options.rdma_ports, pid=pid, gpu_bus_id=gpu_bus)]
        elif name == "tcp_info":  # after procfs: the process's own connections replace the namespace's tcp_retrans
            from perftracker.agent.samplers.tcp_info import TcpInfoSampler

            candidates = [TcpInfoSampler(pid)]
        elif name in ("gpu", "nsys", "nvml"):
            if options.gpu_index == GPU_OFF or options.gpu_index < GPU_AUTO:
                continue
            from perftracker.agent.samplers.nsys import NsysSampler
            from perftracker.agent.samplers.nvml import NvmlSampler

            nvml = NvmlSampler(options.gpu_index, pid=pid, uuid=options.gpu_uuid)
            nvml_ok = nvml.unavailable_reason() is None
            nsys_index = options.gpu_index
            if nsys_index == GPU_AUTO:  # nsys needs the index now: NVML's pick at the sampler's start
                nsys_index = nvml.pick_now() if nvml_ok else GPU_OFF
            gpu_bus = nvml.pci_bus_id() if nvml_ok else ""
            nsys = NsysSampler(nsys_index, options.nsys_frequency_hz, options.gpu_lock_dir,
                               fallback=nvml if nvml_ok else None)
            by_name: dict[str, list[Sampler]] = {"gpu": [nsys, nvml], "nsys": [nsys], "nvml": [nvml]}
            candidates = by_name[name]
        else:
            log.warning("unknown sampler %r ignored", name)
        for cand in candidates:
            reason = cand.unavailable_reason()
            if reason is None:
                out.append(cand)
                if cand.name == "nsys" and nvml_ok:  # nsys reads no clocks, throttle reasons or power
                    health = NvmlSampler(nsys_index, pid=pid, health_only=True, nvml=nvml._nvml, uuid=options.gpu_uuid)
                    if health.unavailable_reason() is None:
                        out.append(health)
                break
            log.info("sampler %s unavailable: %s", cand.name, reason)
    return out


def run_samplers(samplers: Sequence[Sampler], bounds: WindowBounds) -> SampleSet:
    """Run each sampler in its own thread until ``bounds`` end; merge their series."""
    results: dict[str, Mapping[str, UtilSeries]] = {}

    def _one(s: Sampler) -> None:
        try:
            results[s.name] = s.run(bounds)
        except Exception:  # one broken sampler must not lose the others' samples
            log.exception("sampler %s failed", s.name)

    threads = [threading.Thread(target=_one, args=(s,), name=f"sampler-{s.name}", daemon=True) for s in samplers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    merged: dict[str, UtilSeries] = {}
    for s in samplers:
        merged.update(results.get(s.name, {}))
    return SampleSet(series=merged)


def sample_window(
    pid: int,
    tid: int,
    start_ns: int,
    end_ns: int,
    options: SamplerOptions | None = None,
    bounds: WindowBounds | None = None,
) -> SampleSet:
    """Sample the training thread ``tid`` of process ``pid`` over [start_ns, end_ns] (CLOCK_MONOTONIC).

    Blocks until the window (plus a small edge margin) has passed. Pass ``bounds`` to move the end
    or stop early from another thread.
    """
    opts = options or SamplerOptions()
    b = bounds or WindowBounds(start_ns, end_ns)
    return run_samplers(build_samplers(pid, tid, opts), b)
