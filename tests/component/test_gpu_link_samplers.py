"""The NVML clock/GPM reads and the RDMA port sampler on fixtures in the real formats (issue 34).

NOT VERIFIED ON HARDWARE: NVML is replayed (tests/fixtures/nvml_health_replay.json) through
nvidia-ml-py's function names, return shapes and its real GPM ctypes structure; the RDMA sampler
reads a copy of an mlx5 sysfs tree (tests/fixtures/sysfs_infiniband/) whose counters a thread
advances while the sampler runs. Each source has a must-not twin.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from perftracker.agent.samplers import SamplerOptions, WindowBounds, build_samplers
from perftracker.agent.samplers.nvml import NvmlSampler
from perftracker.agent.samplers.nvml_health import (
    GPM_DRAM_BW_UTIL,
    GPM_NVLINK_TOTAL_RX_PER_SEC,
    GPM_PCIE_RX_PER_SEC,
    GPM_SM_OCCUPANCY,
    GPM_SM_UTIL,
    MIB,
    decode_reasons,
    gpm_series_values,
)
from perftracker.agent.samplers.rdma import (
    WORD_BYTES,
    PortReading,
    RdmaSampler,
    find_ports,
    port_rate_bytes_per_s,
    port_series,
)

from perftracker.model.hardware import (
    IB_LINK_ERRORS,
    IB_XMIT_WAIT,
    SM_CLOCK,
    THROTTLE_POWER,
    THROTTLE_SW,
    THROTTLE_THERMAL,
    max_mhz_of,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"
pynvml = pytest.importorskip("pynvml")  # the real GPM structure; nvidia-ml-py is a dependency of the GPU path


# --------------------------------------------------------------------------- NVML, decoded
def test_throttle_reasons_decode_with_nvml_bit_values() -> None:
    assert decode_reasons(pynvml.nvmlClocksThrottleReasonHwThermalSlowdown) == {
        THROTTLE_THERMAL: True, THROTTLE_POWER: False, THROTTLE_SW: False}
    assert decode_reasons(pynvml.nvmlClocksThrottleReasonSwPowerCap)[THROTTLE_POWER]
    assert decode_reasons(pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown)[THROTTLE_POWER]
    assert decode_reasons(pynvml.nvmlClocksThrottleReasonApplicationsClocksSetting)[THROTTLE_SW]
    # the twin: an idle GPU lowers its clock without being throttled
    assert not any(decode_reasons(pynvml.nvmlClocksThrottleReasonGpuIdle).values())
    assert not any(decode_reasons(0).values())


def test_gpm_metric_ids_are_nvmls_and_become_series() -> None:
    assert (GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_DRAM_BW_UTIL) == (
        pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
    assert GPM_PCIE_RX_PER_SEC == pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC
    assert GPM_NVLINK_TOTAL_RX_PER_SEC == pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    v = gpm_series_values({2: 95.0, 3: 41.5, 10: 63.0, 20: 1024.0, 21: 8192.0, 60: 120000.0, 61: 60000.0},
                          pcie_peak_bytes_per_s=64e9, nvlink_peak_bytes_per_s=450e9)
    assert v["sm_active"] == pytest.approx(0.95) and v["sm_occupancy"] == pytest.approx(0.415)
    assert "sm" not in v  # GPM's SM activity never stands for the driver's utilization (issue 43)
    assert v["mem"] == pytest.approx(0.63)  # `mem` now has a writer: GPM DRAM bandwidth
    assert v["gpm_pcie"] == pytest.approx(8192 * MIB / 64e9) and v["gpm_nvlink"] == pytest.approx(120000 * MIB / 450e9)
    assert gpm_series_values({}, 64e9, 450e9) == {}
    # the H200's DRAM bandwidth read NaN on the device check: that series is left out, the others stay
    nan = gpm_series_values({2: 20.0, 10: float("nan"), 21: float("inf")}, 64e9, 450e9)
    assert nan == {"sm_active": pytest.approx(0.20)}


# --------------------------------------------------------------------------- NVML, replayed
class _ReplayNvml:
    """tests/fixtures/nvml_health_replay.json through nvidia-ml-py's names; the GPM metrics
    structure is pynvml's own ctypes type, filled the way the driver fills it."""

    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t

    def __init__(self, fx: dict[str, Any], gpm: bool = True, clocks: bool = True) -> None:
        self.fx, self.gpm, self.clocks = fx, gpm, clocks
        self.i = 0
        self.freed = 0

    def _next(self, key: str) -> Any:
        seq = self.fx[key]
        return seq[min(self.i, len(seq) - 1)]

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetSamples(self, h: str, kind: int, last_us: int) -> tuple[int, list[Any]]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetPcieLinkMaxSpeed(self, h: str) -> int:
        return 32000

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: str) -> int:
        return 16

    def nvmlDeviceGetPcieThroughput(self, h: str, counter: int) -> int:
        return 1000

    def nvmlDeviceGetFieldValues(self, h: str, fields: list[Any]) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _clock_guard(self) -> None:
        if not self.clocks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMaxClockInfo(self, h: str, kind: int) -> int:
        self._clock_guard()
        assert kind == pynvml.NVML_CLOCK_SM
        return int(self.fx["max_sm_clock_mhz"])

    def nvmlDeviceGetClockInfo(self, h: str, kind: int) -> int:
        self._clock_guard()
        assert kind == pynvml.NVML_CLOCK_SM
        return int(self._next("sm_clock_mhz"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        self._clock_guard()
        return int(self._next("clock_event_reasons"))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        self._clock_guard()
        return int(self.fx["enforced_power_limit_mw"])

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        self._clock_guard()
        v = int(self._next("power_usage_mw"))
        self.i += 1  # one period per power read (the last call of a period)
        return v

    def nvmlGpmQueryDeviceSupport(self, h: str) -> Any:
        if not self.gpm:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(isSupportedDevice=int(self.fx["gpm_supported"]))

    def nvmlGpmSampleAlloc(self) -> object:
        return pynvml.c_nvmlGpmSample_t()  # the opaque sample handle's own ctypes type

    def nvmlGpmSampleGet(self, h: str, sample: object) -> object:
        return sample

    def nvmlGpmSampleFree(self, sample: object) -> None:
        self.freed += 1

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        assert mg.version == pynvml.NVML_GPM_METRICS_GET_VERSION and mg.numMetrics >= 5
        values = self.fx["gpm_metrics"][0]
        for k in range(mg.numMetrics):
            mid = str(mg.metrics[k].metricId)
            mg.metrics[k].nvmlReturn = 0 if mid in values else pynvml.NVML_ERROR_NOT_SUPPORTED
            mg.metrics[k].value = float(values.get(mid, 0.0))
        return mg


def _run(nv: _ReplayNvml, ms: int = 260) -> dict[str, Any]:
    s = NvmlSampler(0, nvml=nv, period_ms=20)
    assert s.unavailable_reason() is None
    now = time.monotonic_ns()
    return dict(s.run(WindowBounds(now, now + ms * 1_000_000)))


def test_nvml_reads_clock_reasons_power_and_gpm_from_the_replay() -> None:
    fx = json.loads((FIXTURES / "nvml_health_replay.json").read_text())
    nv = _ReplayNvml(fx)
    out = _run(nv)
    clock = out[SM_CLOCK]
    assert max_mhz_of(clock.source) == 1980
    got = np.round(clock.value.astype(float), 3).tolist()
    assert got[:6] == [1.0, 1.0, round(1095 / 1980, 3), round(1095 / 1980, 3), round(1095 / 1980, 3),
                       round(1095 / 1980, 3)]
    assert out[THROTTLE_THERMAL].value[:6].tolist() == [0, 0, 1, 1, 1, 1]
    assert out[THROTTLE_POWER].value[6] == 1 and out[THROTTLE_THERMAL].value[6] == 0
    assert not out[THROTTLE_THERMAL].value[7] and not out[THROTTLE_POWER].value[7]  # idle: no reason
    assert out["power"].value[1] == pytest.approx(690 / 700, rel=1e-3)
    # GPM beside the driver's reads (issue 43): SM activity as sm_active, DRAM bandwidth as mem, at
    # GPM's own cadence; "sm" stays the driver's (none in this replay) and "pcie" the driver's counter
    assert out["sm_active"].source == "nvml gpm" and out["sm_active"].value[0] == pytest.approx(0.95)
    assert out["mem"].value[0] == pytest.approx(0.63) and out["sm_occupancy"].value[0] == pytest.approx(0.415)
    assert "sm" not in out and out["pcie"].source == "nvml"
    assert out["sm_active"].period_ns == 200_000_000 and len(out["sm_active"].t_ns) <= 2
    assert nv.freed == 2  # the two GPM sample buffers are given back


def test_nvml_without_clock_calls_or_gpm_keeps_the_older_series_only() -> None:
    """The twin: an older GPU (no GPM) with a driver that refuses the clock calls."""
    fx = json.loads((FIXTURES / "nvml_health_replay.json").read_text())
    out = _run(_ReplayNvml(fx, gpm=False, clocks=False), ms=120)
    assert SM_CLOCK not in out and THROTTLE_THERMAL not in out and "mem" not in out and "power" not in out
    assert out["pcie"].source == "nvml"  # NVML's own PCIe throughput, as before


# --------------------------------------------------------------------------------- RDMA
def test_port_rate_and_counter_units() -> None:
    assert port_rate_bytes_per_s("200 Gb/sec (4X HDR)\n") == 25e9
    assert port_rate_bytes_per_s("garbage") == 0.0
    peak = 25e9
    # 0.5 s at half the link rate: the data counters count 4-byte words
    words = peak * 0.5 * 0.5 / WORD_BYTES
    rs = [PortReading(0, 0.0, 0.0, 0.0, 0.0), PortReading(500_000_000, words * WORD_BYTES, 0.0, 25_000_000, 1.0)]
    s = port_series(rs, peak, 500_000_000, tick_ns=4.0)
    assert s["nic"].value[0] == pytest.approx(0.5)
    assert s[IB_XMIT_WAIT].value[0] == pytest.approx(25_000_000 * 4.0 / 500_000_000)
    assert s[IB_LINK_ERRORS].value[0] == 1.0
    quiet = port_series([PortReading(0, 10.0, 10.0, 5.0, 2.0), PortReading(500_000_000, 10.0, 10.0, 5.0, 2.0)],
                        peak, 500_000_000)
    assert quiet["nic"].value[0] == 0 and quiet[IB_XMIT_WAIT].value[0] == 0 and quiet[IB_LINK_ERRORS].value[0] == 0


def test_only_active_ports_are_sampled(tmp_path: Path) -> None:
    root = tmp_path / "infiniband"
    shutil.copytree(FIXTURES / "sysfs_infiniband", root)
    ports = find_ports(root)
    assert [p.name for p in ports] == ["mlx5_0/1"] and ports[0].peak_bytes_per_s == 25e9  # mlx5_1 is DOWN
    assert find_ports(root, ["mlx5_1"]) == []
    assert RdmaSampler(root=tmp_path / "none").unavailable_reason() is not None


def _advance(port: Path, stop: threading.Event, words_per_s: float, wait_ticks_per_s: float) -> None:
    c = port / "counters"
    t0 = time.monotonic()
    base = {n: int((c / n).read_text()) for n in ("port_xmit_data", "port_rcv_data", "port_xmit_wait")}
    while not stop.is_set():
        dt = time.monotonic() - t0
        for name, rate in (("port_xmit_data", words_per_s), ("port_rcv_data", words_per_s / 4),
                           ("port_xmit_wait", wait_ticks_per_s)):
            tmp = c / (name + ".tmp")
            tmp.write_text(f"{base[name] + int(rate * dt)}\n")
            tmp.replace(c / name)
        time.sleep(0.002)


@pytest.mark.parametrize("busy", [True, False])
def test_rdma_sampler_reads_a_live_mlx5_tree(tmp_path: Path, busy: bool) -> None:
    """A writer advances the counters (busy: 60% of the link rate, 40% of the time waiting at the
    assumed 4 ns tick); the twin leaves them still. The sampler runs its own thread over 0.4 s."""
    root = tmp_path / "infiniband"
    shutil.copytree(FIXTURES / "sysfs_infiniband", root)
    port = root / "mlx5_0" / "ports" / "1"
    stop = threading.Event()
    writer = threading.Thread(target=_advance, args=(port, stop, 0.6 * 25e9 / WORD_BYTES if busy else 0.0,
                                                      0.4 / 4e-9 if busy else 0.0), daemon=True)
    writer.start()
    try:
        s = RdmaSampler(root=root, period_ms=20)
        assert s.unavailable_reason() is None
        now = time.monotonic_ns()
        out = s.run(WindowBounds(now, now + 400_000_000))
    finally:
        stop.set()
        writer.join()
    nic, wait = out["nic"], out[IB_XMIT_WAIT]
    assert nic.source == "rdma" and len(nic.t_ns) >= 10
    if busy:
        assert float(np.median(nic.value)) == pytest.approx(0.6, abs=0.1)
        assert float(np.median(wait.value)) == pytest.approx(0.4, abs=0.08)
    else:
        assert float(nic.value.max()) == 0.0 and float(wait.value.max()) == 0.0
    assert float(out[IB_LINK_ERRORS].value.max()) == 0.0


def test_the_rdma_sampler_is_built_after_procfs_so_its_nic_wins(tmp_path: Path) -> None:
    names = [s.name for s in build_samplers(1, 1, SamplerOptions(samplers=("procfs", "rdma")))]
    assert names[0] == "procfs"  # rdma only where a port is active; none on this host's sysfs or it follows
    assert names[1:] in ([], ["rdma"])
