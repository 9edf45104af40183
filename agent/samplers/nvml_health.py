"""NVML clocks, throttle reasons, power and GPM metrics for the NVML sampler (issue 34).

NOT VERIFIED ON HARDWARE: built against nvidia-ml-py's API (function names, return shapes and the
constant values below, checked against nvidia-ml-py 13.615) and tested with a replayed fixture
(tests/fixtures/nvml_health_replay.json); no GPU, driver or NVML here.

- ``ClockReader``: ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)`` over
  ``nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_SM)`` (MHz), the clock-throttle reasons
  (``nvmlDeviceGetCurrentClocksEventReasons``, else the older ``…ThrottleReasons``: a bitmask,
  decoded by ``decode_reasons``), power draw over the enforced limit (mW / mW).
- ``GpmReader``: on GPUs that support GPM (Hopper and later, ``nvmlGpmQueryDeviceSupport``), the
  metrics between two ``nvmlGpmSampleGet`` samples (``nvmlGpmMetricsGet``): SM activity and
  occupancy, DRAM bandwidth, NVLink and PCIe throughput.

Every call is guarded: a GPU or driver without the call loses that series only, logged once.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from perftracker.model.hardware import THROTTLE_POWER, THROTTLE_SW, THROTTLE_THERMAL

log = logging.getLogger(__name__)

NVML_CLOCK_SM = 1
NVML_FI_DEV_POWER_INSTANT = 186  # mW, instant (nvml.h); NVML_FI_DEV_POWER_AVERAGE = 185 is the 1 s mean
# nvmlClocksEventReason* (= nvmlClocksThrottleReason*), NVML's values
REASON_GPU_IDLE = 0x001
REASON_APPLICATIONS_CLOCKS = 0x002
REASON_SW_POWER_CAP = 0x004
REASON_HW_SLOWDOWN = 0x008  # thermal or power brake or external: the clock cut by half or more
REASON_SYNC_BOOST = 0x010
REASON_SW_THERMAL = 0x020
REASON_HW_THERMAL = 0x040
REASON_HW_POWER_BRAKE = 0x080
REASON_DISPLAY_CLOCK = 0x100
# the reason classes of the throttle series (GPU idle is no throttling and belongs to none)
REASON_CLASSES = {
    THROTTLE_THERMAL: REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_SLOWDOWN,
    THROTTLE_POWER: REASON_SW_POWER_CAP | REASON_HW_POWER_BRAKE,
    THROTTLE_SW: REASON_APPLICATIONS_CLOCKS | REASON_SYNC_BOOST | REASON_DISPLAY_CLOCK,
}

# NVML_GPM_METRIC_* ids (nvml.h), and how each becomes a series value in [0, 1]
GPM_SM_UTIL = 2  # % of SMs busy
GPM_SM_OCCUPANCY = 3  # % of warps active vs the theoretical maximum
GPM_DRAM_BW_UTIL = 10  # % of DRAM bandwidth
GPM_PCIE_TX_PER_SEC = 20  # MiB/s
GPM_PCIE_RX_PER_SEC = 21
GPM_NVLINK_TOTAL_RX_PER_SEC = 60  # MiB/s, all links
GPM_NVLINK_TOTAL_TX_PER_SEC = 61
GPM_METRICS = (GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_DRAM_BW_UTIL, GPM_PCIE_TX_PER_SEC, GPM_PCIE_RX_PER_SEC,
               GPM_NVLINK_TOTAL_RX_PER_SEC, GPM_NVLINK_TOTAL_TX_PER_SEC)
NVML_GPM_METRICS_GET_VERSION = 1
# NVML's GPM reference (nvmlGpmMetricsGet) notes that the two nvmlGpmSampleGet calls should be more
# than 100 ms apart (GPM's internal refresh). The sampler reads GPM every GPM_INTERVAL_MS (its own
# cadence and series period, not the 20 ms of the driver's counters), never below the minimum.
GPM_MIN_INTERVAL_MS = 110.0
GPM_INTERVAL_MS = 200.0
MIB = 1 << 20


KNOWN_REASONS = REASON_GPU_IDLE | REASON_CLASSES[THROTTLE_THERMAL] | REASON_CLASSES[THROTTLE_POWER] | REASON_CLASSES[
    THROTTLE_SW]


def decode_reasons(mask: int) -> dict[str, bool]:
    """{throttle series: held} for a clock-event-reasons bitmask. Every bit has a class: GPU idle is
    none; a bit NVML added after these (not named in nvml.h 13.x) counts as a software slowdown, so
    that a clock held down for a reason this code does not know still shows as held."""
    out = {name: bool(mask & bits) for name, bits in REASON_CLASSES.items()}
    if mask & ~KNOWN_REASONS:
        out[THROTTLE_SW] = True
    return out


class _Once:
    """Log each failing call once (a GPU that lacks it fails every period)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, what: str, exc: BaseException) -> None:
        if what not in self.seen:
            self.seen.add(what)
            log.info("nvml: %s unavailable (%s: %s); that series is left out", what, type(exc).__name__, exc)


@dataclass
class ClockSample:
    sm_clock: float | None  # SM clock over its maximum
    reasons: dict[str, bool] | None
    power: float | None  # draw over the enforced limit


class ClockReader:
    """SM clock, throttle reasons and power of one GPU, one call per period."""

    def __init__(self, nv: Any, handle: Any) -> None:
        self.nv, self.h = nv, handle
        self.once = _Once()
        self.max_mhz = self._call("max SM clock", lambda: float(nv.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_SM)))
        self.power_limit_mw = self._call("power limit", lambda: float(nv.nvmlDeviceGetEnforcedPowerLimit(handle)))
        self._reasons_fn = self._pick_reasons_fn()
        self._power_instant = self._instant_power_mw() is not None

    def _pick_reasons_fn(self) -> Any:
        """The clock-reasons call the driver exports: nvidia-ml-py 12.535+ has
        ``nvmlDeviceGetCurrentClocksEventReasons`` whatever the driver, and a driver older than R535
        has no such symbol (NVMLError_FunctionNotFound on every call): try each and keep the first
        that answers."""
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self.nv, name, None)
            if fn is None:
                continue
            try:
                int(fn(self.h))
            except Exception as exc:  # noqa: BLE001 - FunctionNotFound, NotSupported: try the other
                log.info("nvml: %s: %s: %s", name, type(exc).__name__, exc)
                continue
            return fn
        return None

    def _instant_power_mw(self) -> float | None:
        """Instant power (NVML_FI_DEV_POWER_INSTANT) where the field answers: on Ampere (but GA100)
        and later, ``nvmlDeviceGetPowerUsage`` is a 1 s average, too slow for a 20 ms series."""
        try:
            v = self.nv.nvmlDeviceGetFieldValues(self.h, [NVML_FI_DEV_POWER_INSTANT])[0]
            if int(v.nvmlReturn) != 0:
                return None
            return float(v.value.uiVal)
        except Exception:  # noqa: BLE001 - an old driver or nvidia-ml-py without the field
            return None

    def _call(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # NVMLError_NotSupported, a missing function in an old nvidia-ml-py
            self.once(what, exc)
            return None

    def read(self) -> ClockSample:
        nv, h = self.nv, self.h
        clock = None
        if self.max_mhz:
            mhz = self._call("SM clock", lambda: float(nv.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)))
            clock = None if mhz is None else min(max(mhz / self.max_mhz, 0.0), 1.0)
        reasons = None
        if self._reasons_fn is not None:
            fn = self._reasons_fn
            mask = self._call("clock throttle reasons", lambda: int(fn(h)))
            reasons = None if mask is None else decode_reasons(mask)
        power = None
        if self.power_limit_mw:
            mw = self._instant_power_mw() if self._power_instant else None
            if mw is None:
                mw = self._call("power draw", lambda: float(nv.nvmlDeviceGetPowerUsage(h)))
            power = None if mw is None else min(max(mw / self.power_limit_mw, 0.0), 1.0)
        return ClockSample(clock, reasons, power)


class GpmReader:
    """GPM metrics between consecutive samples (Hopper and later). ``supported`` is False (and
    nothing is read) where the GPU, driver or nvidia-ml-py lacks GPM."""

    def __init__(self, nv: Any, handle: Any, interval_ms: float = GPM_INTERVAL_MS, supported: bool = True) -> None:
        self.nv, self.h = nv, handle
        self.once = _Once()
        self.supported = False
        self.interval_ns = int(max(interval_ms, GPM_MIN_INTERVAL_MS) * 1e6)
        self._prev: Any = None
        self._spare: Any = None
        self._prev_ns = 0
        if not supported:  # not asked for
            return
        try:
            self.supported = bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            if self.supported:
                self._prev = nv.nvmlGpmSampleGet(handle, nv.nvmlGpmSampleAlloc())
                self._prev_ns = time.monotonic_ns()
                self._spare = nv.nvmlGpmSampleAlloc()
        except Exception as exc:
            self.once("GPM", exc)
            self.supported = False

    def due(self, now_ns: int) -> bool:
        """Whether a GPM interval has passed since the previous sample (NVML asks for more than
        100 ms between two ``nvmlGpmSampleGet``: closer samples read stale zeros and clipped ratios)."""
        return self.supported and now_ns - self._prev_ns >= self.interval_ns

    def read(self, now_ns: int | None = None) -> dict[int, float]:
        """{metric id: value} over the interval since the previous sample; {} when unsupported,
        failed, or sooner than ``interval_ns`` after it (the previous sample is kept)."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        if not self.due(now_ns):
            return {}
        nv = self.nv
        try:
            cur = nv.nvmlGpmSampleGet(self.h, self._spare)
            self._prev_ns = now_ns
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            mg.sample1, mg.sample2 = self._prev, cur
            for i, mid in enumerate(GPM_METRICS):
                mg.metrics[i].metricId = mid
            nv.nvmlGpmMetricsGet(mg)
            self._prev, self._spare = cur, self._prev
            return {int(mg.metrics[i].metricId): float(mg.metrics[i].value)
                    for i in range(len(GPM_METRICS)) if int(mg.metrics[i].nvmlReturn) == 0}
        except Exception as exc:
            self.once("GPM metrics", exc)
            return {}

    def close(self) -> None:
        for s in (self._prev, self._spare):
            if s is not None:
                try:
                    self.nv.nvmlGpmSampleFree(s)
                except Exception as exc:  # noqa: BLE001 - freeing is best effort
                    log.debug("nvml: GPM sample free: %s", exc)
        self._prev = self._spare = None


GPM_PCIE = "gpm_pcie"  # GPM's PCIe and NVLink throughput, kept beside the driver's "pcie" and "nvlink"
GPM_NVLINK = "gpm_nvlink"
GPM_SM_ACTIVE = "sm_active"  # GPM's share of SMs busy: NOT the driver's "sm" (share of time a kernel ran)


def gpm_series_values(metrics: dict[int, float], pcie_peak_bytes_per_s: float,
                      nvlink_peak_bytes_per_s: float) -> dict[str, float]:
    """{series: value in [0, 1]} from one interval's GPM metrics; a metric the GPU returns as NaN or
    infinite (the DRAM bandwidth of an H200 read NaN in every interval on the device check) is left out.
    GPM's SM activity is ``sm_active``, never ``sm``: the compute pattern's μ/σ are calibrated on the
    driver's utilization (the H200 device check read GPM 0.20 under a saturating matmul, at 20 ms)."""
    metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
    out: dict[str, float] = {}

    def clip(x: float) -> float:
        return min(max(x, 0.0), 1.0)

    if GPM_SM_UTIL in metrics:
        out[GPM_SM_ACTIVE] = clip(metrics[GPM_SM_UTIL] / 100.0)
    if GPM_SM_OCCUPANCY in metrics:
        out["sm_occupancy"] = clip(metrics[GPM_SM_OCCUPANCY] / 100.0)
    if GPM_DRAM_BW_UTIL in metrics:
        out["mem"] = clip(metrics[GPM_DRAM_BW_UTIL] / 100.0)
    pcie = [metrics[m] for m in (GPM_PCIE_TX_PER_SEC, GPM_PCIE_RX_PER_SEC) if m in metrics]
    if pcie and pcie_peak_bytes_per_s > 0:
        out[GPM_PCIE] = clip(max(pcie) * MIB / pcie_peak_bytes_per_s)
    nvl = [metrics[m] for m in (GPM_NVLINK_TOTAL_RX_PER_SEC, GPM_NVLINK_TOTAL_TX_PER_SEC) if m in metrics]
    if nvl and nvlink_peak_bytes_per_s > 0:
        out[GPM_NVLINK] = clip(max(nvl) * MIB / nvlink_peak_bytes_per_s)
    return out
