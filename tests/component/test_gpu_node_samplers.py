"""What an 8-GPU H100/H200 node would break in the NVML sampler (issue 43, items 3, 4, 5, 9).

NOT VERIFIED ON HARDWARE: NVML is faked through nvidia-ml-py's own names, error classes and return
shapes, with the values NVML documents (field ids, return codes, the nvmlPcieLinkMaxSpeed_t and
nvmlNvlinkVersion_t enums, 1 s averaged power on Ampere and later) and the sysfs PCI format the
kernel writes ("32.0 GT/s PCIe"). ``bench/gpu_check.py`` prints the raw values on a real node.
Each case has a twin that must not change.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from perftracker.agent.samplers import SamplerOptions, WindowBounds, build_samplers
from perftracker.agent.samplers import nvml as nvml_mod
from perftracker.agent.samplers.nvml import NvmlSampler
from perftracker.agent.samplers.nvml_health import ClockReader, GpmReader, decode_reasons
from perftracker.agent.samplers.nvml_links import lane_bytes_per_s, nvlink_peak, pcie_peak

from perftracker.model.hardware import SM_CLOCK, THROTTLE_POWER, THROTTLE_SW, THROTTLE_THERMAL

pynvml = pytest.importorskip("pynvml")
OK, NOT_SUPPORTED = 0, pynvml.NVML_ERROR_NOT_SUPPORTED


def _err(code: int) -> Exception:
    return pynvml.NVMLError(code)  # nvidia-ml-py maps the code to its subclass (NVMLError_NotSupported, ...)


class _H100:
    """One H100 SXM as a driver that refuses the common NVLink speed field answers it: 18 active
    links, NVLink 4.0 (enum 6), the speed fields NOT_SUPPORTED with value 0, link 18 an invalid
    argument; PCIe Gen5 x16 with the max speed returned as its enum code (5)."""

    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX

    def __init__(self, link_speed_mbps: float = 0.0, generation: bool = False, event_reasons: bool = True,
                 reasons: int = 0, instant_mw: int | None = 690_000) -> None:
        self.link_speed_mbps, self.generation, self.event_reasons = link_speed_mbps, generation, event_reasons
        self.reasons, self.instant_mw = reasons, instant_mw
        self.nvl_kib = 0.0
        self.gpm_gets: list[int] = []

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    # links
    def nvmlDeviceGetNvLinkState(self, h: str, link: int) -> int:
        if link >= 18:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkVersion(self, h: str, link: int) -> int:
        return pynvml.NVML_NVLINK_VERSION_4_0

    def nvmlDeviceGetFieldValues(self, h: str, fields: list[Any]) -> list[Any]:
        out = []
        for f in fields:
            fid = f[0] if isinstance(f, tuple) else f
            ret, v = NOT_SUPPORTED, 0.0
            if fid == pynvml.NVML_FI_DEV_NVLINK_GET_SPEED and self.link_speed_mbps:
                ret, v = OK, self.link_speed_mbps
            elif fid in (self.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, self.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
                self.nvl_kib += 90e9 * 0.02 / 1024 / 2  # ~90 GB/s for each 20 ms period (tx and rx calls)
                ret, v = OK, self.nvl_kib
            elif fid == pynvml.NVML_FI_DEV_POWER_INSTANT and self.instant_mw is not None:
                ret, v = OK, float(self.instant_mw)
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=ret, value=SimpleNamespace(uiVal=int(v), ullVal=int(v))))
        return out

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: str) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: str) -> int:
        if not self.generation:
            raise _err(NOT_SUPPORTED)
        return 5

    def nvmlDeviceGetPcieLinkMaxSpeed(self, h: str) -> int:
        return pynvml.NVML_PCIE_LINK_MAX_SPEED_32000MBPS  # the enum code, 5

    def nvmlDeviceGetPcieThroughput(self, h: str, counter: int) -> int:
        return 6_300_000  # KB/s: a tenth of Gen5 x16

    def nvmlDeviceGetSamples(self, h: str, kind: int, last_us: int) -> tuple[int, list[Any]]:
        ts = time.time_ns() // 1000
        return 0, [SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=97))] if ts > last_us else []

    # clocks, reasons, power
    def nvmlDeviceGetMaxClockInfo(self, h: str, kind: int) -> int:
        return 1980

    def nvmlDeviceGetClockInfo(self, h: str, kind: int) -> int:
        return 1755

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        if not self.event_reasons:  # a driver before R535 exports no such symbol
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: str) -> int:
        return self.reasons

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return 700_000

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 350_000  # the 1 s average, lagging a step up to 690 W

    # GPM (every metric reads 50; the cadence is what is tested)
    def nvmlGpmQueryDeviceSupport(self, h: str) -> Any:
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> object:
        return pynvml.c_nvmlGpmSample_t()  # the opaque sample handle's own ctypes type

    def nvmlGpmSampleGet(self, h: str, sample: object) -> object:
        self.gpm_gets.append(time.monotonic_ns())
        return sample

    def nvmlGpmSampleFree(self, sample: object) -> None:
        pass

    def c_nvmlGpmMetricsGet_t(self) -> Any:
        return pynvml.c_nvmlGpmMetricsGet_t()

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        for k in range(mg.numMetrics):
            mg.metrics[k].nvmlReturn = 0
            mg.metrics[k].value = 50.0
        return mg


# ------------------------------------------------------------------------------------ item 4
def test_nvlink_peak_from_active_links_when_the_common_speed_field_is_not_supported() -> None:
    raw: dict[str, Any] = {}
    peak, how = nvlink_peak(_H100(), "gpu0", raw)
    assert peak == pytest.approx(18 * 25e9) and "18 active links" in how and "version 6" in how
    assert raw["nvlink_speed_mbps_common"] == {"nvmlReturn": NOT_SUPPORTED, "value": 0.0}  # what the old code read as the peak
    # per-link speeds where the scoped field answers
    peak, how = nvlink_peak(_H100(link_speed_mbps=26_562), "gpu0")
    assert peak == pytest.approx(18 * 26_562e6) and "per-link speed" in how


def test_no_nvlink_gives_no_peak() -> None:
    class _PcieCard(_H100):
        def nvmlDeviceGetNvLinkState(self, h: str, link: int) -> int:
            raise _err(NOT_SUPPORTED)

    assert nvlink_peak(_PcieCard(), "gpu0") == (0.0, "")


def test_pcie_peak_decodes_the_max_speed_enum_and_prefers_the_generation(tmp_path: Path) -> None:
    gen5_x16 = lane_bytes_per_s(32_000) * 16
    assert gen5_x16 == pytest.approx(32e9 / 8 * 128 / 130 * 16)
    peak, how = pcie_peak(_H100(), "gpu0", tmp_path)
    assert peak == pytest.approx(gen5_x16) and "32000 MT/s" in how  # not 5 Mbit/s per lane (10 MB/s)
    peak, how = pcie_peak(_H100(generation=True), "gpu0", tmp_path)
    assert peak == pytest.approx(gen5_x16) and how == "nvml gen5 x16"
    assert lane_bytes_per_s(5_000) == pytest.approx(5e9 / 8 * 0.8)  # 8b/10b below Gen3


def test_pcie_peak_from_sysfs_when_nvml_has_none(tmp_path: Path) -> None:
    class _NoPcie(_H100):
        def nvmlDeviceGetPcieLinkMaxSpeed(self, h: str) -> int:
            raise _err(NOT_SUPPORTED)

        def nvmlDeviceGetPciInfo(self, h: str) -> Any:
            return SimpleNamespace(busId=b"00000000:18:00.0")

    dev = tmp_path / "0000:18:00.0"
    dev.mkdir()
    (dev / "max_link_speed").write_text("16.0 GT/s PCIe\n")  # the kernel's format
    (dev / "max_link_width").write_text("16\n")
    peak, how = pcie_peak(_NoPcie(), "gpu0", tmp_path)
    assert peak == pytest.approx(lane_bytes_per_s(16_000) * 16) and how.startswith("sysfs 16.0 GT/s")
    assert pcie_peak(_NoPcie(), "gpu0", tmp_path / "none")[0] == 0.0


def test_the_sampler_measures_nvlink_and_pcie_against_the_real_peaks() -> None:
    nv = _H100()
    s = NvmlSampler(0, nvml=nv, period_ms=20)
    assert s.unavailable_reason() is None
    now = time.monotonic_ns()
    out = s.run(WindowBounds(now, now + 300_000_000))
    assert "nvlink" in out and 0.1 < float(out["nvlink"].value.max()) < 0.4  # ~90 of 450 GB/s
    assert float(out["pcie"].value.max()) == pytest.approx(6_300_000e3 / (lane_bytes_per_s(32_000) * 16), rel=1e-3)


# ------------------------------------------------------------------------------------ item 3
def test_gpm_is_sampled_at_its_own_cadence_not_every_period() -> None:
    nv = _H100()
    s = NvmlSampler(0, nvml=nv, period_ms=20)
    assert s.unavailable_reason() is None
    now = time.monotonic_ns()
    out = s.run(WindowBounds(now, now + 600_000_000))
    gaps_ms = [(b - a) / 1e6 for a, b in zip(nv.gpm_gets, nv.gpm_gets[1:], strict=False)]
    assert gaps_ms and min(gaps_ms) >= 110  # NVML: more than 100 ms between GPM samples
    assert 2 <= len(nv.gpm_gets) <= 5  # ~600 ms / 200 ms, not one per 20 ms period
    assert out["sm_active"].period_ns == 200_000_000 and out["sm_active"].source == "nvml gpm"
    assert out["sm"].source == "nvml" and float(out["sm"].value.max()) == pytest.approx(0.97)  # the driver's


def test_gpm_reader_keeps_its_previous_sample_until_the_interval_passed() -> None:
    nv = _H100()
    r = GpmReader(nv, "gpu0", interval_ms=20)  # asked for 20 ms: held at the minimum
    assert r.interval_ns == 110_000_000
    t0 = nv.gpm_gets[0]
    assert r.read(t0 + 50_000_000) == {} and len(nv.gpm_gets) == 1
    assert r.read(t0 + 120_000_000) != {} and len(nv.gpm_gets) == 2


# ------------------------------------------------------------------------------------ item 5
def test_nsys_on_path_keeps_nvml_clocks_throttle_and_power(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nsys = tmp_path / "bin" / "nsys"
    nsys.parent.mkdir()
    nsys.write_text("#!/bin/sh\nexit 0\n")
    nsys.chmod(nsys.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{nsys.parent}{os.pathsep}{os.environ['PATH']}")
    nv = _H100(reasons=pynvml.nvmlClocksEventReasonSwPowerCap)
    monkeypatch.setattr(nvml_mod, "_load_nvml", lambda: nv)
    samplers = build_samplers(os.getpid(), 1, SamplerOptions(samplers=("gpu",), gpu_index=0, gpu_lock_dir=str(tmp_path)))
    assert [s.name for s in samplers] == ["nsys", "nvml_health"]
    now = time.monotonic_ns()
    out = samplers[1].run(WindowBounds(now, now + 120_000_000))
    assert {SM_CLOCK, THROTTLE_POWER, "power"} <= set(out) and float(out[THROTTLE_POWER].value.max()) == 1.0
    assert not {"sm", "pcie", "nvlink", "sm_active"} & set(out)  # nsys's series stay nsys's
    assert nv.gpm_gets == []
    # the twin: without nsys the full NVML sampler runs alone
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert [s.name for s in build_samplers(os.getpid(), 1, SamplerOptions(samplers=("gpu",), gpu_index=0,
                                                                          gpu_lock_dir=str(tmp_path)))] == ["nvml"]


# ------------------------------------------------------------------------------------ item 9
def test_throttle_reasons_by_what_the_driver_exports() -> None:
    power_cap = pynvml.nvmlClocksThrottleReasonSwPowerCap
    old_driver = ClockReader(_H100(event_reasons=False, reasons=power_cap), "gpu0")
    assert old_driver.read().reasons == {THROTTLE_THERMAL: False, THROTTLE_POWER: True, THROTTLE_SW: False}
    new_driver = ClockReader(_H100(reasons=power_cap), "gpu0")
    assert new_driver.read().reasons == old_driver.read().reasons


def test_every_reason_bit_has_a_class() -> None:
    assert decode_reasons(0x200)[THROTTLE_SW]  # a bit newer than nvml.h 13's: held, not dropped
    assert not any(decode_reasons(pynvml.nvmlClocksEventReasonGpuIdle).values())
    for bit in range(9):
        mask = 1 << bit
        assert mask == pynvml.nvmlClocksEventReasonGpuIdle or any(decode_reasons(mask).values()), hex(mask)


def test_power_is_the_instant_field_where_the_driver_has_it() -> None:
    assert ClockReader(_H100(), "gpu0").read().power == pytest.approx(690 / 700)
    assert ClockReader(_H100(instant_mw=None), "gpu0").read().power == pytest.approx(350 / 700)  # the twin


# ------------------------------------------------------------------------------------ item 6
def _ib_tree(tmp_path: Path) -> Path:
    import shutil

    root = tmp_path / "infiniband"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "sysfs_infiniband", root)
    (root / "mlx5_1" / "ports" / "1" / "state").write_text("4: ACTIVE\n")
    return root


@pytest.mark.parametrize("stuck", [True, False])
def test_a_saturated_xmit_wait_is_unavailable_not_healthy(tmp_path: Path, stuck: bool) -> None:
    """port_xmit_wait is 32 bits in sysfs even with the extended counters, and IBTA counters stop at
    their maximum: a stuck 4294967295 reads "no wait" forever. link_downed (8 bits) stops at 255."""
    from perftracker.agent.samplers.rdma import find_ports, port_series, read_port

    from perftracker.model.hardware import IB_LINK_ERRORS, IB_XMIT_WAIT

    root = _ib_tree(tmp_path)
    c = root / "mlx5_0" / "ports" / "1" / "counters"
    (c / "port_xmit_wait").write_text(f"{2**32 - 1 if stuck else 2**32 - 2}\n")
    (c / "link_downed").write_text(f"{255 if stuck else 254}\n")
    port = find_ports(root, ["mlx5_0"])[0]
    first = read_port(port, 0)
    (c / "port_xmit_data").write_text(f"{int((c / 'port_xmit_data').read_text()) + 1000}\n")
    second = read_port(port, 10_000_000)
    assert first is not None and second is not None
    out = port_series([first, second], port.peak_bytes_per_s, 10_000_000)
    assert (IB_XMIT_WAIT in out) is (not stuck) and IB_LINK_ERRORS in out and "nic" in out
    assert (first.errors == 0) is stuck  # a stuck link_downed counts nothing; 254 still counts


def test_each_rank_gets_the_nic_nearest_its_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two active HCAs: mlx5_0 behind the GPU's own PCIe switch, mlx5_1 (a storage NIC) on the other
    socket. The layout is sysfs's: /sys/bus/pci/devices/<id> and infiniband/<hca>/device link to the
    device's directory under /sys/devices/pci<domain>:<bus>/..."""
    from perftracker.agent.samplers.rdma import (
        RdmaSampler,
        find_ports,
        nearest_ports,
        select_by_nccl,
    )

    root = _ib_tree(tmp_path)
    dev = tmp_path / "devices"
    switch = dev / "pci0000:00" / "0000:00:01.0" / "0000:01:00.0"
    gpu, nic0, nic1 = switch / "0000:02:00.0", switch / "0000:02:01.0", dev / "pci0000:80" / "0000:80:01.0" / "0000:81:00.0"
    for d in (gpu, nic0, nic1):
        d.mkdir(parents=True)
    pci = tmp_path / "bus_pci_devices"
    pci.mkdir()
    (pci / "0000:02:00.0").symlink_to(gpu)
    (root / "mlx5_0" / "device").symlink_to(nic0)
    (root / "mlx5_1" / "device").symlink_to(nic1)
    ports = find_ports(root)
    assert [p.name for p in ports] == ["mlx5_0/1", "mlx5_1/1"]  # what every rank merged before
    assert [p.name for p in nearest_ports(ports, root, "0000:02:00.0", pci)] == ["mlx5_0/1"]
    assert [p.name for p in nearest_ports(ports, root, "0000:99:00.0", pci)] == ["mlx5_0/1", "mlx5_1/1"]  # unknown GPU
    # NCCL_IB_HCA's forms: prefix, exact, exclusion, with a port
    assert [p.name for p in select_by_nccl(ports, "mlx5_1")] == ["mlx5_1/1"]
    assert [p.name for p in select_by_nccl(ports, "^mlx5_1")] == ["mlx5_0/1"]
    assert [p.name for p in select_by_nccl(ports, "=mlx5_0:1")] == ["mlx5_0/1"]
    assert [p.name for p in select_by_nccl(ports, "mlx5_0:2")] == []
    s = RdmaSampler(root=root, gpu_bus_id="0000:02:00.0", pci_root=pci)
    assert s.unavailable_reason() is None and [p.name for p in s.ports] == ["mlx5_0/1"]


# ------------------------------------------------------------------------------------ item 8
class _Uuid:
    """torch's _CUuuid prints 8-4-4-4-12 hex without NVML's "GPU-" prefix (torch/csrc/cuda/Module.cpp)."""

    def __str__(self) -> str:
        return "6f1f3c2a-93d1-1b2e-8c4d-2f0e5a7b9c01"


def test_the_process_says_its_own_gpu_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from perftracker.runtime.gpu_identity import own_gpu_uuid

    assert own_gpu_uuid() == "" or torch.cuda.is_initialized()  # this CPU host: nothing to say
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    asked: list[int] = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: asked.append(i) or SimpleNamespace(uuid=_Uuid()))
    assert own_gpu_uuid() == "" and asked == []  # CUDA not initialised by the job: never touched
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert own_gpu_uuid() == "GPU-6f1f3c2a-93d1-1b2e-8c4d-2f0e5a7b9c01" and asked == [3]
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(name="H100"))  # torch 2.3.1
    assert own_gpu_uuid() == ""


def test_the_sampler_takes_the_gpu_the_process_names_over_its_guess() -> None:
    """A pod of 4 GPUs renumbered by NVIDIA_VISIBLE_DEVICES, NVML listing host pids: LOCAL_RANK=1 guesses
    NVML's GPU 1; the process's own UUID is GPU 2's. The twin: without a UUID the guess stands."""
    import subprocess
    import sys

    from perftracker.agent.samplers.gpu_pick import resolve_gpu

    uuids = ["GPU-0a0a0a0a-0000-0000-0000-000000000000", "GPU-1b1b1b1b-0000-0000-0000-000000000000",
             "GPU-6f1f3c2a-93d1-1b2e-8c4d-2f0e5a7b9c01", "GPU-3d3d3d3d-0000-0000-0000-000000000000"]

    class _Pod:
        def nvmlDeviceGetCount(self) -> int:
            return 4

        def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
            return f"gpu{i}"

        def nvmlDeviceGetUUID(self, h: str) -> bytes:
            return uuids[int(h[-1])].encode()  # older nvidia-ml-py: bytes

        def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
            return [SimpleNamespace(pid=4_000_000 + int(h[-1]), usedGpuMemory=1 << 34)]  # host pids

        def nvmlDeviceGetGraphicsRunningProcesses(self, h: str) -> list[Any]:
            return []

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    try:
        said = resolve_gpu(_Pod(), child.pid, "GPU-6f1f3c2a-93d1-1b2e-8c4d-2f0e5a7b9c01")
        guess = resolve_gpu(_Pod(), child.pid)
        no_match = resolve_gpu(_Pod(), child.pid, "MIG-aaaa")
    finally:
        child.kill()
        child.wait()
    assert said.index == 2 and "own CUDA device" in said.how
    assert guess.index == 1 and no_match.index == 1


def test_the_window_reads_the_uuid_on_the_training_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The current CUDA device is per thread: the channel's thread (which arms the window) sees device
    0 on every rank. The window learns the UUID at a training-thread boundary and passes that one."""
    import threading

    import torch

    from perftracker.runtime.window import profile as profile_mod
    from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult
    from tests.window_workload import Ident, drive

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device",
                        lambda: 3 if threading.current_thread() is threading.main_thread() else 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=f"uuid-of-device-{i}"))
    spawned: list[tuple[str, ...]] = []

    class _NoSampler:
        @staticmethod
        def spawn(pid: int, tid: int, window_s: float, out: Path, extra_args: tuple[str, ...] = (),
                  cpus: tuple[int, ...] = ()) -> Any:
            spawned.append(tuple(extra_args))
            raise OSError("no sampler process in this test")

    monkeypatch.setattr(profile_mod, "SamplerProcess", _NoSampler)
    opts = WindowOptions(stacks="off", spawn_sampler=True, nvtx=False, converge=False)

    def arm_from_another_thread(win: ProfileWindow, done: list[WindowResult]) -> None:
        t = threading.Thread(target=lambda: win.arm("s1", 0.2, done.append))
        t.start()
        t.join()

    for learned in (True, False):
        spawned.clear()
        win = ProfileWindow(Ident(), tmp_path / str(learned), options=opts)
        if learned:
            win.on_boundary(time.monotonic_ns(), 1)  # a training-thread boundary before the window
        done: list[WindowResult] = []
        arm_from_another_thread(win, done)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the window itself profiles the CPU
        drive(win, done, limit_s=30)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        got = spawned[0]
        if learned:
            assert got == ("--gpu-uuid", "GPU-uuid-of-device-3")
        else:
            assert "--gpu-uuid" not in got  # never device 0's, read on the arming thread
