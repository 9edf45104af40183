"""The peak bandwidth of a GPU's PCIe and NVLink links, from sources that hold on real drivers
(issue 43, item 4). Per direction, bytes/s; 0.0 when no source gives it.

NOT VERIFIED ON HARDWARE: built against nvidia-ml-py's functions and constants (13.x) and NVML's
documented return values, tested with fakes in nvidia-ml-py's shapes. ``bench/gpu_check.py`` prints
every raw value read here (``link_peaks``), which settles each source on a real node.

PCIe, first source that gives a value:

1. ``nvmlDeviceGetMaxPcieLinkGeneration`` (the generation the device and the system can reach)
   × ``nvmlDeviceGetMaxPcieLinkWidth``: 2.5/5/8/16/32/64 GT/s per lane by generation.
2. ``nvmlDeviceGetPcieLinkMaxSpeed`` × width. The API documents MB/s, but its C type is the enum
   ``nvmlPcieLinkMaxSpeed_t`` (NVML_PCIE_LINK_MAX_SPEED_32000MBPS = 5): a value of 1-6 is read as
   that code, never as 5 Mbit/s (which would put the peak near 10 MB/s and clip every sample to 1).
3. sysfs ``/sys/bus/pci/devices/<bus id>/max_link_speed`` ("32.0 GT/s PCIe") × ``max_link_width``.

Bytes per transfer: 8b/10b for generations 1-2, 128b/130b for 3-5, 242/256 for 6 (FLIT).

NVLink: the active links (``nvmlDeviceGetNvLinkState`` per link index until the driver refuses the
index; nvidia-ml-py's NVML_NVLINK_MAX_LINKS is an upper bound over all GPUs, 36) times the speed of
each, from the first field that answers with NVML_SUCCESS: ``NVML_FI_DEV_NVLINK_GET_SPEED`` scoped
to the link, ``NVML_FI_DEV_NVLINK_SPEED_MBPS_L<i>`` (links 0-11), ``…_SPEED_MBPS_COMMON``; else the
link's version (``nvmlDeviceGetNvLinkVersion``, an enum: 4.0 is 6, 3.1 is 5) and that version's
per-link rate. Each field's ``nvmlReturn`` is checked: some H100 drivers answer the common speed with
NVML_ERROR_NOT_SUPPORTED and a zero value, which read unchecked gave a peak of 0 (no ``nvlink``
series at all, and every collective measured against PCIe).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PCI_ROOT = Path("/sys/bus/pci/devices")
GT_PER_GEN = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
MAX_SPEED_CODES = {1: 2500, 2: 5000, 3: 8000, 4: 16000, 5: 32000, 6: 64000}  # nvmlPcieLinkMaxSpeed_t -> MT/s
NVLINK_MAX_LINKS = 36
# nvmlNvlinkVersion_t -> GB/s per link per direction (NVLink 1.0: 20; 2.x, 3.x, 4.0: 25; 5.0: 50)
NVLINK_GBPS_BY_VERSION = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}
# NVML field ids (nvml.h)
FI_NVLINK_SPEED_MBPS_L = (84, 85, 86, 87, 88, 89, 132, 133, 134, 135, 136, 137)  # links 0-11
FI_NVLINK_SPEED_MBPS_COMMON = 90
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_GET_SPEED = 164  # scoped to a link
_GT = re.compile(r"^\s*([0-9.]+)\s*GT/s")


def lane_bytes_per_s(mt_per_s: float) -> float:
    """One lane's data rate in bytes/s at ``mt_per_s`` mega-transfers/s, after line encoding."""
    if mt_per_s <= 0:
        return 0.0
    enc = 0.8 if mt_per_s <= 5000 else (242 / 256 if mt_per_s >= 64000 else 128 / 130)
    return mt_per_s * 1e6 / 8 * enc


@dataclass
class LinkPeaks:
    pcie_bytes_per_s: float = 0.0
    pcie_source: str = ""
    nvlink_bytes_per_s: float = 0.0
    nvlink_source: str = ""
    raw: dict[str, Any] = field(default_factory=dict)  # every value read, for the device check


def _call(raw: dict[str, Any], key: str, fn: Any) -> Any:
    try:
        v = fn()
    except Exception as exc:  # NVMLError_NotSupported, _FunctionNotFound, a missing nvidia-ml-py function
        raw[key] = f"{type(exc).__name__}: {exc}"
        return None
    raw[key] = v if isinstance(v, (int, float, str)) else repr(v)
    return v


def _bus_id(nv: Any, h: Any, raw: dict[str, Any]) -> str | None:
    info = _call(raw, "pci_info", lambda: nv.nvmlDeviceGetPciInfo(h))
    bus = getattr(info, "busId", None)
    if isinstance(bus, bytes):
        bus = bus.decode(errors="replace")
    if not bus:
        return None
    raw["pci_bus_id"] = bus
    dom, _, rest = str(bus).lower().partition(":")
    return f"{dom[-4:]}:{rest}" if rest else None  # NVML's 8-digit domain -> sysfs's 4


def sysfs_bus_id(nv: Any, h: Any) -> str | None:
    """The GPU's PCI device as sysfs names it, or None."""
    return _bus_id(nv, h, {})


def pcie_peak(nv: Any, h: Any, pci_root: Path = PCI_ROOT, raw: dict[str, Any] | None = None) -> tuple[float, str]:
    """(bytes/s per direction, the source used) of the GPU's PCIe link."""
    raw = {} if raw is None else raw
    width = _call(raw, "pcie_max_width", lambda: int(nv.nvmlDeviceGetMaxPcieLinkWidth(h)))
    gen = _call(raw, "pcie_max_generation", lambda: int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h)))
    if width and gen in GT_PER_GEN:
        return lane_bytes_per_s(GT_PER_GEN[gen] * 1000) * width, f"nvml gen{gen} x{width}"
    speed = _call(raw, "pcie_link_max_speed", lambda: int(nv.nvmlDeviceGetPcieLinkMaxSpeed(h)))
    if width and speed:
        mt = MAX_SPEED_CODES.get(speed, speed if speed >= 2500 else 0)
        if mt:
            return lane_bytes_per_s(mt) * width, f"nvml max speed {speed} ({mt} MT/s) x{width}"
    bus = _bus_id(nv, h, raw)
    if bus:
        try:
            text = (pci_root / bus / "max_link_speed").read_text()
            lanes = int((pci_root / bus / "max_link_width").read_text().split()[0])
        except (OSError, ValueError, IndexError) as exc:
            raw["sysfs"] = f"{type(exc).__name__}: {exc}"
        else:
            raw["sysfs_max_link_speed"], raw["sysfs_max_link_width"] = text.strip(), lanes
            m = _GT.match(text)
            if m and lanes > 0:
                return lane_bytes_per_s(float(m.group(1)) * 1000) * lanes, f"sysfs {text.strip()} x{lanes}"
    return 0.0, ""


def _field(nv: Any, h: Any, fid: int, scope: int | None, raw: dict[str, Any], key: str) -> float | None:
    """One field value, or None unless NVML answered it with NVML_SUCCESS and a value > 0."""
    try:
        vals = nv.nvmlDeviceGetFieldValues(h, [(fid, scope) if scope is not None else fid])
        v = vals[0]
        ret = int(v.nvmlReturn)
        value = float(v.value.uiVal)
    except Exception as exc:
        raw[key] = f"{type(exc).__name__}: {exc}"
        return None
    raw[key] = {"nvmlReturn": ret, "value": value}
    return value if ret == 0 and value > 0 else None


def nvlink_peak(nv: Any, h: Any, raw: dict[str, Any] | None = None) -> tuple[float, str]:
    """(bytes/s per direction over all active links, the source used)."""
    raw = {} if raw is None else raw
    active: list[int] = []
    states: dict[int, Any] = {}
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS))):
        try:
            state = int(nv.nvmlDeviceGetNvLinkState(h, link))
        except Exception as exc:  # INVALID_ARGUMENT past the GPU's links, NOT_SUPPORTED without NVLink
            states[link] = f"{type(exc).__name__}"
            if link == 0 or "InvalidArgument" in type(exc).__name__:
                break
            continue
        states[link] = state
        if state == 1:
            active.append(link)
    raw["nvlink_state"] = states
    if not active and not isinstance(states.get(0), int):  # no per-link state: the link-count field
        count = _field(nv, h, FI_NVLINK_LINK_COUNT, None, raw, "nvlink_link_count")
        common = _field(nv, h, FI_NVLINK_SPEED_MBPS_COMMON, None, raw, "nvlink_speed_mbps_common")
        if count and common:
            return common * 1e6 * count, f"{int(count)} links (count field), common speed"
        return 0.0, ""
    if not active:
        return 0.0, ""
    total, how = 0.0, set()
    common = None
    for link in active:
        mbps = _field(nv, h, FI_NVLINK_GET_SPEED, link, raw, f"nvlink_get_speed_l{link}")
        src = "per-link speed"
        if mbps is None and link < len(FI_NVLINK_SPEED_MBPS_L):
            mbps = _field(nv, h, FI_NVLINK_SPEED_MBPS_L[link], None, raw, f"nvlink_speed_mbps_l{link}")
            src = "per-link speed field"
        if mbps is None:
            if common is None:
                common = _field(nv, h, FI_NVLINK_SPEED_MBPS_COMMON, None, raw, "nvlink_speed_mbps_common") or 0.0
            mbps, src = (common, "common speed") if common > 0 else (None, "")
        if mbps is None:
            ver = _call(raw, f"nvlink_version_l{link}", lambda lk=link: int(nv.nvmlDeviceGetNvLinkVersion(h, lk)))
            gbps = NVLINK_GBPS_BY_VERSION.get(ver or 0, 0.0)
            mbps, src = gbps * 1000.0, f"version {ver}"
        if mbps > 0:
            total += mbps * 1e6
            how.add(src)
    return total, f"{len(active)} active links, {', '.join(sorted(how))}" if total > 0 else ""


def link_peaks(nv: Any, h: Any, pci_root: Path = PCI_ROOT) -> LinkPeaks:
    out = LinkPeaks()
    out.pcie_bytes_per_s, out.pcie_source = pcie_peak(nv, h, pci_root, out.raw)
    out.nvlink_bytes_per_s, out.nvlink_source = nvlink_peak(nv, h, out.raw)
    log.info("nvml: PCIe peak %.3g B/s (%s), NVLink peak %.3g B/s (%s)", out.pcie_bytes_per_s,
             out.pcie_source or "none", out.nvlink_bytes_per_s, out.nvlink_source or "none")
    return out
