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


def read_port(port: Port, t_ns: int) -> PortReading | None:
    c = port.path / "counters"
    xmit, rcv = _read_int(c / "port_xmit_data"), _read_int(c / "port_rcv_data")
    if xmit is None or rcv is None:
        return None
    wait = _read_int(c / "port_xmit_wait") or 0.0
    errors = sum(v for v in (_read_int(c / n) for n in ERROR_COUNTERS) if v is not None)
    hw = {n: v for n in HW_COUNTERS if (v := _read_int(port.path / "hw_counters" / n)) is not None}
    return PortReading(t_ns, xmit * WORD_BYTES, rcv * WORD_BYTES, wait, errors, hw)


def port_series(readings: Sequence[PortReading], peak_bytes_per_s: float, period_ns: int,
                tick_ns: float = DEFAULT_XMIT_WAIT_TICK_NS) -> dict[str, UtilSeries]:
    """``nic``, ``ib_xmit_wait`` and ``ib_link_errors`` of one port from its readings (pure)."""
    if len(readings) < 2:
        return {}
    t = np.array([r.t_ns for r in readings], dtype=np.int64)
    tx = rate_series("nic", t, np.array([r.xmit_bytes for r in readings]), peak_bytes_per_s, period_ns, "rdma")
    rx = rate_series("nic", t, np.array([r.rcv_bytes for r in readings]), peak_bytes_per_s, period_ns, "rdma")
    dt_ns = np.diff(t).astype(np.float64)
    dw = np.maximum(np.diff(np.array([r.xmit_wait_ticks for r in readings])), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = np.where(dt_ns > 0, dw * tick_ns / dt_ns, 0.0)
    err = (np.diff(np.array([r.errors for r in readings])) > 0).astype(np.float32)
    out = {IB_XMIT_WAIT: UtilSeries(IB_XMIT_WAIT, t[1:], np.clip(wait, 0, 1).astype(np.float32), period_ns, "rdma"),
           IB_LINK_ERRORS: UtilSeries(IB_LINK_ERRORS, t[1:], err, period_ns, "rdma")}
    if peak_bytes_per_s > 0:
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
                 tick_ns: float = DEFAULT_XMIT_WAIT_TICK_NS) -> None:
        self.want = tuple(ports)
        self.period_ms = period_ms
        self.root = root
        self.tick_ns = tick_ns
        self.ports: list[Port] = []

    def unavailable_reason(self) -> str | None:
        self.ports = find_ports(self.root, self.want)
        if not self.ports:
            return f"no active RDMA port under {self.root}" + (f" named {','.join(self.want)}" if self.want else "")
        return None

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
