"""The RDMA sampler: InfiniBand / RoCE port counters from sysfs, the NIC series of collectives that
bypass the kernel (NCCL over IB or RoCE: ``/proc/net/dev`` reads zero while the link is busy).

NOT VERIFIED ON HARDWARE: built against the kernel's sysfs layout and mlx5's counter names, and
tested on a fixture tree (tests/fixtures/sysfs_infiniband/, hand-written in the sysfs format, not
captured from an HCA).

Per port ``/sys/class/infiniband/<hca>/ports/<port>/``:

- ``counters/port_xmit_data``, ``counters/port_rcv_data``: data in 4-byte words (IBTA
  PortXmitData/PortRcvData; the kernel reports the 64-bit extended counters where the HCA has them);
  bytes = words × 4. ``nic``: the larger of send and receive rate over the port's rate.
- ``counters/port_xmit_wait``: ticks in which the port had data and could not send. ``ib_xmit_wait``:
  Δticks × ``xmit_wait_tick_ns`` / Δt. The tick length is the HCA's (not fixed by sysfs); the default
  is an assumption, so the localizer's expected range on it is coarse, and the differential test
  (a rank against its peers on the same fabric) does not depend on it.
- ``counters/symbol_error``, ``link_downed``, ``link_error_recovery``, ``port_rcv_errors``:
  ``ib_link_errors`` is 1 in an interval where any of them grew.
- ``hw_counters/`` (mlx5): read when present for RoCE congestion (``np_cnp_sent``,
  ``rp_cnp_handled``, ``out_of_buffer``), kept in ``PortReading.hw`` for the report's evidence.
- ``rate``: "200 Gb/sec (4X HDR)" -> the port's peak in bytes/s; ``state``: only ACTIVE ports.

Ports: ``ports`` ("mlx5_0:1,mlx5_3:1", as NCCL_IB_HCA names them) or every active port. With
several ports each series takes the busiest port per interval (the rank's traffic goes through
one of them; which one is NCCL's choice).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from perftracker.agent.samplers.base import WindowBounds, rate_series

from perftracker.model.hardware import IB_LINK_ERRORS, IB_XMIT_WAIT
from perftracker.model.raw_window import UtilSeries

log = logging.getLogger(__name__)

SYSFS_ROOT = Path("/sys/class/infiniband")
WORD_BYTES = 4  # port_xmit_data / port_rcv_data count 4-byte words
DEFAULT_XMIT_WAIT_TICK_NS = 4.0  # an assumption (see the module doc)
ERROR_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors")
# the widths the kernel reads them with (drivers/infiniband/core/sysfs.c, PORT_PMA_ATTR): port_xmit_wait
# is 32-bit even with the extended counter set; the data counters 64-bit with it (else 32)
COUNTER_BITS = {"port_xmit_wait": 32, "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8,
                "port_rcv_errors": 16, "port_xmit_data": 64, "port_rcv_data": 64}
DATA_COUNTERS = ("port_xmit_data", "port_rcv_data")
HW_COUNTERS = ("np_cnp_sent", "rp_cnp_handled", "out_of_buffer")
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


@dataclass(frozen=True)
class Port:
    hca: str
    port: str
    path: Path
    peak_bytes_per_s: float

    @property
    def name(self) -> str:
        return f"{self.hca}/{self.port}"


@dataclass(frozen=True)
class PortReading:
    t_ns: int
    xmit_bytes: float
    rcv_bytes: float
    xmit_wait_ticks: float
    errors: float
    hw: Mapping[str, float] = field(default_factory=dict)


def _read_int(path: Path) -> float | None:
    try:
        return float(int(path.read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return None


def port_rate_bytes_per_s(text: str) -> float:
    """"200 Gb/sec (4X HDR)" -> 25e9; 0.0 when unreadable."""
    m = _RATE.match(text)
    return float(m.group(1)) * 1e9 / 8 if m else 0.0


def find_ports(root: Path = SYSFS_ROOT, only: Sequence[str] = ()) -> list[Port]:
    """The active ports under ``root`` (``only``: "hca:port" or "hca" names to keep)."""
    out: list[Port] = []
    if not root.is_dir():
        return out
    want = {w.strip() for w in only if w.strip()}
    for hca in sorted(p for p in root.iterdir() if (p / "ports").is_dir()):
        for port in sorted((hca / "ports").iterdir(), key=lambda p: p.name):
            if want and hca.name not in want and f"{hca.name}:{port.name}" not in want:
                continue
            try:
                state = (port / "state").read_text()
                rate = (port / "rate").read_text()
            except OSError:
                continue
            if "ACTIVE" not in state:
                continue
            out.append(Port(hca.name, port.name, port, port_rate_bytes_per_s(rate)))
    return out


def saturated(name: str, value: float) -> bool:
    """Whether a sysfs PMA counter sits at the maximum of its width: IBTA counters stop there
    instead of wrapping, so it can never grow again until cleared (``perfquery -R``). The data
    counters are 64-bit only where the HCA has the extended set; 2^32 - 1 is their end without it."""
    bits = COUNTER_BITS.get(name)
    if bits is None:
        return False
    return value >= (1 << bits) - 1 or (name in DATA_COUNTERS and value == (1 << 32) - 1)


PCI_ROOT = Path("/sys/bus/pci/devices")


def parse_nccl_ib_hca(spec: str) -> tuple[tuple[str, ...], bool, bool]:
    """NCCL_IB_HCA as NCCL reads it: (names, exclude, exact). "mlx5_0:1,mlx5_3" keeps HCAs whose
    name starts with each entry (port optional); a leading "^" excludes them instead; "=" asks for
    exact names."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    spec = spec.lstrip("=")
    return tuple(x.strip() for x in spec.split(",") if x.strip()), exclude, exact


def _hca_matches(port: Port, entry: str, exact: bool) -> bool:
    hca, _, num = entry.partition(":")
    if num and num != port.port:
        return False
    return port.hca == hca if exact else port.hca.startswith(hca)


def select_by_nccl(ports: Sequence[Port], spec: str) -> list[Port]:
    names, exclude, exact = parse_nccl_ib_hca(spec)
    if not names:
        return list(ports)
    hit = [p for p in ports if any(_hca_matches(p, n, exact) for n in names)]
    return [p for p in ports if p not in hit] if exclude else hit


def _pci_chain(path: Path) -> tuple[str, ...]:
    """The PCI devices from the root complex down to ``path`` (its resolved sysfs path's parts)."""
    try:
        real = path.resolve(strict=True)
    except OSError:
        return ()
    return tuple(x for x in real.parts if re.match(r"^(pci)?[0-9a-f]{4}:[0-9a-f]{2}", x))


def nearest_ports(ports: Sequence[Port], root: Path, gpu_bus_id: str, pci_root: Path = PCI_ROOT) -> list[Port]:
    """The ports of the HCA(s) nearest the GPU on the PCIe tree (the longest common chain of PCI
    bridges: the NIC behind the GPU's own switch, as NCCL picks it); every port where the tree
    cannot be read. A storage NIC on another switch or socket is left out."""
    gpu = _pci_chain(pci_root / gpu_bus_id)
    if not gpu:
        return list(ports)
    depth: dict[str, int] = {}
    for p in ports:
        chain = _pci_chain(root / p.hca / "device")
        n = 0
        while n < min(len(chain), len(gpu)) and chain[n] == gpu[n]:
            n += 1
        depth[p.name] = n if chain else -1
    best = max(depth.values(), default=-1)
    return [p for p in ports if depth[p.name] == best] if best > 0 else list(ports)


def _environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def read_port(port: Port, t_ns: int) -> PortReading | None:
    """One reading; a saturated counter reads as unavailable: NaN for the data and wait counters,
    left out of the error sum (a stuck counter reads as "no change": a healthy link forever)."""
    c = port.path / "counters"
    xmit, rcv = _read_int(c / "port_xmit_data"), _read_int(c / "port_rcv_data")
    if xmit is None or rcv is None:
        return None
    if saturated("port_xmit_data", xmit) or saturated("port_rcv_data", rcv):
        xmit = rcv = float("nan")
    wait = _read_int(c / "port_xmit_wait")
    if wait is None or saturated("port_xmit_wait", wait):
        wait = float("nan")
    errors = sum(v for n in ERROR_COUNTERS if (v := _read_int(c / n)) is not None and not saturated(n, v))
    hw = {n: v for n in HW_COUNTERS if (v := _read_int(port.path / "hw_counters" / n)) is not None}
    return PortReading(t_ns, xmit * WORD_BYTES, rcv * WORD_BYTES, wait, errors, hw)


def port_series(readings: Sequence[PortReading], peak_bytes_per_s: float, period_ns: int,
                tick_ns: float = DEFAULT_XMIT_WAIT_TICK_NS) -> dict[str, UtilSeries]:
    """``nic``, ``ib_xmit_wait`` and ``ib_link_errors`` of one port from its readings (pure)."""
    if len(readings) < 2:
        return {}
    t = np.array([r.t_ns for r in readings], dtype=np.int64)
    out: dict[str, UtilSeries] = {}
    dt_ns = np.diff(t).astype(np.float64)
    waits = np.array([r.xmit_wait_ticks for r in readings])
    if np.isfinite(waits).all():  # a saturated port_xmit_wait: no series, never a healthy-looking 0
        dw = np.maximum(np.diff(waits), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            wait = np.where(dt_ns > 0, dw * tick_ns / dt_ns, 0.0)
        out[IB_XMIT_WAIT] = UtilSeries(IB_XMIT_WAIT, t[1:], np.clip(wait, 0, 1).astype(np.float32), period_ns, "rdma")
    err = (np.diff(np.array([r.errors for r in readings])) > 0).astype(np.float32)
    out[IB_LINK_ERRORS] = UtilSeries(IB_LINK_ERRORS, t[1:], err, period_ns, "rdma")
    xmit = np.array([r.xmit_bytes for r in readings])
    rcv = np.array([r.rcv_bytes for r in readings])
    if peak_bytes_per_s > 0 and np.isfinite(xmit).all() and np.isfinite(rcv).all():
        tx = rate_series("nic", t, xmit, peak_bytes_per_s, period_ns, "rdma")
        rx = rate_series("nic", t, rcv, peak_bytes_per_s, period_ns, "rdma")
        out["nic"] = UtilSeries("nic", tx.t_ns, np.maximum(tx.value, rx.value), period_ns, "rdma")
    return out


def busiest(per_port: Sequence[Mapping[str, UtilSeries]]) -> dict[str, UtilSeries]:
    """Each series' per-interval maximum over the ports (aligned by sample index: one loop reads them all)."""
    out: dict[str, UtilSeries] = {}
    for name in {k for m in per_port for k in m}:
        ss = [m[name] for m in per_port if name in m]
        n = min(len(s.t_ns) for s in ss)
        v = np.max(np.stack([s.value[:n] for s in ss]), axis=0)
        out[name] = UtilSeries(name, ss[0].t_ns[:n], v.astype(np.float32), ss[0].period_ns, ss[0].source)
    return out


class RdmaSampler:
    name = "rdma"

    def __init__(self, ports: Sequence[str] = (), period_ms: float = 10.0, root: Path = SYSFS_ROOT,
                 tick_ns: float = DEFAULT_XMIT_WAIT_TICK_NS, pid: int = 0, gpu_bus_id: str = "",
                 pci_root: Path = PCI_ROOT) -> None:
        self.want = tuple(ports)
        self.period_ms = period_ms
        self.root = root
        self.tick_ns = tick_ns
        self.pid, self.gpu_bus_id, self.pci_root = pid, gpu_bus_id, pci_root
        self.ports: list[Port] = []
        self.how = ""

    def unavailable_reason(self) -> str | None:
        self.ports = find_ports(self.root, self.want)
        if not self.ports:
            return f"no active RDMA port under {self.root}" + (f" named {','.join(self.want)}" if self.want else "")
        self.ports, self.how = self._rank_ports(self.ports)
        if not self.ports:
            return f"no active RDMA port of this rank's under {self.root} ({self.how})"
        log.info("rdma: ports %s (%s)", ",".join(p.name for p in self.ports), self.how)
        return None

    def _rank_ports(self, ports: list[Port]) -> tuple[list[Port], str]:
        """This rank's own NIC, not every port of the node (every rank would get the same series):
        the names given, else the worker's NCCL_IB_HCA, else the HCA nearest its GPU on the PCIe tree."""
        if self.want:
            return ports, "named"
        spec = _environ_of(self.pid).get("NCCL_IB_HCA", "") if self.pid else ""
        if spec:
            ports = select_by_nccl(ports, spec)
            if len(ports) <= 1 or not self.gpu_bus_id:
                return ports, f"NCCL_IB_HCA={spec}"
        if self.gpu_bus_id:
            near = nearest_ports(ports, self.root, self.gpu_bus_id, self.pci_root)
            return near, f"nearest GPU {self.gpu_bus_id}" + (f", NCCL_IB_HCA={spec}" if spec else "")
        return ports, "every active port (GPU unknown)"

    def run(self, bounds: WindowBounds) -> Mapping[str, UtilSeries]:
        if not self.ports or not bounds.wait_for_start():
            return {}
        readings: dict[str, list[PortReading]] = {p.name: [] for p in self.ports}
        while True:
            now = time.monotonic_ns()
            if bounds.done(now):
                break
            for p in self.ports:
                r = read_port(p, now)
                if r is not None:
                    readings[p.name].append(r)
            time.sleep(self.period_ms / 1000)
        period_ns = int(self.period_ms * 1e6)
        per_port = [port_series(readings[p.name], p.peak_bytes_per_s, period_ns, self.tick_ns) for p in self.ports]
        return {k: bounds.trim(v) for k, v in busiest([m for m in per_port if m]).items()}
