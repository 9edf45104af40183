"""The NVML sampler (nvidia-ml-py): SM utilization, clocks, throttle reasons, power, PCIe and NVLink
throughput of one GPU, and GPM metrics where the GPU has them.

NOT VERIFIED ON HARDWARE: built against nvidia-ml-py's API and tested with a replayed fixture.

- ``sm``: ``nvmlDeviceGetSamples(handle, NVML_GPU_UTILIZATION_SAMPLES, last_seen_us)``: the driver's
  own utilization samples (percent of time a kernel ran, ~every 1/6 s to 1/50 s depending on the
  GPU), timestamped in CLOCK_REALTIME µs; converted to CLOCK_MONOTONIC with the offset measured at
  start (as the profiler's times are).
- ``pcie``: ``nvmlDeviceGetPcieThroughput`` TX and RX (KB/s over the driver's 20 ms window), max of
  the two over the link's peak per direction (``nvml_links.pcie_peak``: generation × width, the
  max-speed enum decoded, or sysfs).
- ``nvlink``: ``nvmlDeviceGetFieldValues`` NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (KiB counters,
  all links), rate over the active links' peak (``nvml_links.nvlink_peak``: each field's return
  code checked, per-link speeds, else the link version's rate).
- ``sm_clock``, ``throttle_thermal``/``throttle_power``/``throttle_sw``, ``power``: SM clock over its
  maximum, the clock-throttle reasons by class, instant power draw over the limit, every period
  (``perftracker.agent.samplers.nvml_health.ClockReader``). ``health_only`` (beside nsys, which
  reads utilization but no clocks) samples these alone, as the sampler "nvml_health".
- GPM (Hopper and later; ``nvml_health.GpmReader``), at its own cadence (every 200 ms: NVML asks
  for more than 100 ms between GPM samples) and period: ``sm_active`` (share of SMs busy),
  ``sm_occupancy``, ``mem`` (DRAM bandwidth), ``gpm_pcie``, ``gpm_nvlink``. They never replace
  ``sm``, ``pcie`` or ``nvlink``: the compute pattern's μ/σ are calibrated on the driver's
  utilization (share of time a kernel ran), which GPM's SM activity is not.
NVML reads the driver's counters, not the GPU profiling counters, so it never conflicts with
CUPTI, nsys or DCGM profiling: it is the fallback when those hold the counters. (GPM shares the
profiling hardware with DCGM's profiling module on some drivers; a refused GPM call costs only its
series.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from perftracker.agent.samplers.base import WindowBounds, rate_series
from perftracker.agent.samplers.nvml_health import (
    GPM_NVLINK,
    GPM_PCIE,
    GPM_SM_ACTIVE,
    ClockReader,
    GpmReader,
    gpm_series_values,
)
from perftracker.agent.samplers.nvml_links import LinkPeaks, link_peaks

from perftracker.model.hardware import NVLINK, PCIE, SM_CLOCK, clock_source
from perftracker.model.raw_window import UtilSeries

log = logging.getLogger(__name__)

ALL_LINKS = 0xFFFFFFFF


def _load_nvml() -> Any:
    import pynvml

    return pynvml


def realtime_offset_ns() -> int:
    m0 = time.monotonic_ns()
    r = time.time_ns()
    m1 = time.monotonic_ns()
    return r - (m0 + m1) // 2


class NvmlSampler:
    name = "nvml"

    def __init__(self, gpu_index: int, nvml: Any = None, period_ms: float = 20.0, pid: int = 0,
                 health_only: bool = False, uuid: str = "") -> None:
        self.gpu_index = gpu_index  # < 0: the GPU process ``pid`` uses, picked when the window starts
        self.uuid = uuid  # the GPU the process says it uses: picked by it, before any guess
        self.health_only = health_only  # clocks, throttle reasons and power only (beside nsys)
        if health_only:
            self.name = "nvml_health"
        self.pid = pid
        self._auto = gpu_index < 0
        self._nvml = nvml
        self.period_ms = period_ms
        self._handle: Any = None

    def unavailable_reason(self) -> str | None:
        try:
            nv = self._nvml or _load_nvml()
            nv.nvmlInit()
            if self._auto:
                if int(nv.nvmlDeviceGetCount()) < 1:
                    return "NVML sees no GPU"
            else:
                self._handle = nv.nvmlDeviceGetHandleByIndex(self.gpu_index)
            self._nvml = nv
        except Exception as exc:  # ImportError, NVMLError (no driver, no such GPU)
            return f"NVML unavailable: {type(exc).__name__}: {exc}"
        return None

    def pick_now(self) -> int:
        """The NVML index of the GPU the process uses (``gpu_pick``), or -1; sets the handle."""
        from perftracker.agent.samplers.gpu_pick import resolve_gpu

        if not self._auto:
            return self.gpu_index
        pick = resolve_gpu(self._nvml, self.pid, self.uuid)
        log.info("nvml: GPU for pid %d: %s (%s)", self.pid, pick.index, pick.how)
        if pick.index is None:
            return -1
        try:
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(pick.index)
        except Exception as exc:  # noqa: BLE001
            log.warning("nvml: GPU %d: %s", pick.index, exc)
            return -1
        self.gpu_index = pick.index
        return pick.index

    def pci_bus_id(self) -> str:
        """The sysfs name of the GPU's PCI device ("0000:18:00.0"), or "" before a GPU is picked."""
        if self._handle is None:
            return ""
        from perftracker.agent.samplers.nvml_links import sysfs_bus_id

        return sysfs_bus_id(self._nvml, self._handle) or ""

    def _nvlink_fields(self) -> tuple[float, float] | None:
        nv = self._nvml
        try:
            vals = nv.nvmlDeviceGetFieldValues(self._handle, [
                (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
                (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
            ])
            if any(v.nvmlReturn != 0 for v in vals):
                return None
            return float(vals[0].value.ullVal), float(vals[1].value.ullVal)
        except Exception:
            return None

    def run(self, bounds: WindowBounds) -> Mapping[str, UtilSeries]:
        if not bounds.wait_for_start():
            return {}
        if self._auto and self.pick_now() < 0:  # picked now: the process has its CUDA context by the window
            return {}
        nv = self._nvml
        h = self._handle
        offset = realtime_offset_ns()
        period_ns = int(self.period_ms * 1e6)
        clocks = ClockReader(nv, h)
        extra: dict[str, tuple[list[int], list[float]]] = {}

        def put(name: str, t_ns: int, value: float) -> None:
            ts, vs = extra.setdefault(name, ([], []))
            ts.append(t_ns)
            vs.append(value)

        if self.health_only:  # beside nsys: clocks, throttle reasons and power only
            gpm = GpmReader(nv, h, supported=False)
            peaks = LinkPeaks()
        else:
            peaks = link_peaks(nv, h)
            gpm = GpmReader(nv, h)
        pcie_peak, nvl_peak = peaks.pcie_bytes_per_s, peaks.nvlink_bytes_per_s
        sm_t: list[int] = []
        sm_v: list[float] = []
        pc_t: list[int] = []
        pc_v: list[float] = []
        nl_t: list[int] = []
        nl_tx: list[float] = []
        nl_rx: list[float] = []
        last_us = (time.time_ns() // 1000) - 1_000_000
        while True:
            now = time.monotonic_ns()
            if bounds.done(now):
                break
            cs = clocks.read()
            if cs.sm_clock is not None:
                put(SM_CLOCK, now, cs.sm_clock)
            for name, held in (cs.reasons or {}).items():
                put(name, now, 1.0 if held else 0.0)
            if cs.power is not None:
                put("power", now, cs.power)
            if self.health_only:
                time.sleep(self.period_ms / 1000)
                continue
            if gpm.due(now):  # its own cadence (more than 100 ms), not every period
                for name, v in gpm_series_values(gpm.read(now), pcie_peak, nvl_peak).items():
                    put(name, now, v)
            try:
                _, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, last_us)
                for s in samples:
                    if s.timeStamp > last_us:
                        sm_t.append(int(s.timeStamp) * 1000 - offset)
                        sm_v.append(float(s.sampleValue.uiVal) / 100.0)
                        last_us = int(s.timeStamp)
            except Exception as exc:  # NVML_ERROR_NOT_FOUND: no new sample yet
                log.debug("nvml samples: %s", exc)
            if pcie_peak > 0:
                try:
                    tx = nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES)
                    rx = nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES)
                    pc_t.append(now)
                    pc_v.append(max(tx, rx) * 1000.0 / pcie_peak)
                except Exception as exc:
                    log.debug("nvml pcie: %s", exc)
            if nvl_peak > 0:
                f = self._nvlink_fields()
                if f is not None:
                    nl_t.append(now)
                    nl_tx.append(f[0] * 1024)
                    nl_rx.append(f[1] * 1024)
            time.sleep(self.period_ms / 1000)
        gpm.close()
        out: dict[str, UtilSeries] = {}
        if sm_t:
            order = np.argsort(sm_t, kind="stable")
            t = np.array(sm_t, np.int64)[order]
            out["sm"] = UtilSeries("sm", t, np.clip(np.array(sm_v, np.float32)[order], 0, 1), _median_period(t), "nvml")
        if pc_t:
            out[PCIE] = UtilSeries(PCIE, np.array(pc_t, np.int64), np.clip(np.array(pc_v, np.float32), 0, 1),
                                     period_ns, "nvml")
        if len(nl_t) > 1:
            t = np.array(nl_t, np.int64)
            tx = rate_series(NVLINK, t, np.array(nl_tx), nvl_peak, period_ns, "nvml")
            rx = rate_series(NVLINK, t, np.array(nl_rx), nvl_peak, period_ns, "nvml")
            out[NVLINK] = UtilSeries(NVLINK, tx.t_ns, np.maximum(tx.value, rx.value), period_ns, "nvml")
        for name, (ts, vs) in extra.items():  # clocks, reasons, power; GPM's series under their own names
            gpm_series = name in (GPM_SM_ACTIVE, "sm_occupancy", "mem", GPM_PCIE, GPM_NVLINK)
            src = clock_source("nvml", clocks.max_mhz or 0.0) if name == SM_CLOCK else ("nvml gpm" if gpm_series else "nvml")
            out[name] = UtilSeries(name, np.array(ts, np.int64), np.clip(np.array(vs, np.float32), 0, 1),
                                   gpm.interval_ns if gpm_series else period_ns, src)
        return {k: bounds.trim(v) for k, v in out.items()}


def _median_period(t: np.ndarray) -> int:
    return int(np.median(np.diff(t))) if len(t) > 1 else 0
