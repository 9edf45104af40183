"""The procfs sampler (always available on Linux): training-thread CPU, NIC and disk utilization.

- ``cpu``: the training thread's cumulative run time, read every ``period_us`` (1 ms by default),
  from one of two sources (``ProcfsOptions.cpu_source``; the one used is logged once per process
  and recorded as ``UtilSeries.source``):
  - ``perf`` (the default where the kernel permits it): the thread's ``PERF_COUNT_SW_TASK_CLOCK``
    counter (``perftracker.agent.samplers.taskclock``). A read brings it up to date, so each 1 ms difference
    is the thread's exact on-CPU time in that interval. Needs CAP_PERFMON (or root) or
    ``perf_event_paranoid`` <= 1.
  - ``schedstat`` (fallback when ``perf_event_open`` is refused, or ``cpu_source="schedstat"``):
    ``/proc/<pid>/task/<tid>/schedstat`` (first field, ``se.sum_exec_runtime`` in ns).
    The kernel updates that counter only when the thread is descheduled and at scheduler ticks
    (every 4 ms at HZ=250), so raw 1 ms differences read as a staircase of 0 % and 400 %. Between two
    updates a thread first sleeps and then runs without a break up to the update (it is only
    descheduled at an update), so each increase Δ is the run time of the last Δ ns before the
    update. ``cpu_utilization`` rebuilds the run intervals that way and averages them over each
    sample interval: right on average, but a single sample can be off by up to a tick's worth.
  Each reading is stamped with the midpoint of clock reads taken just before and after it; a
  reading that took longer than ``max_read_us`` (the sampler was preempted) is dropped, and the
  next interval covers the gap.
- ``cpu_wait``: the share of each interval the training thread was runnable without a core
  (schedstat ``run_delay``, read every tick beside the run time; ``perftracker.agent.samplers.cpuwait``).
- ``nic``: bytes per interface from ``/proc/<pid>/net/dev`` (the target's network namespace), each
  interface normalized by its link speed from ``/sys/class/net/<if>/speed`` when known, else by
  ``nic_peak_bps`` (bits/s, default 10 Gbit/s; loopback and virtual devices have no speed).
  Utilization is max(rx, tx) / peak, as a full-duplex link carries the peak each way. One series per
  interface (``nic:<if>``) and ``nic`` = the per-sample max over interfaces.
- ``disk``: ``read_bytes + write_bytes`` of the process's I/O counters (psutil's ``io_counters``,
  from ``/proc/<pid>/io``: bytes that reached the storage layer), normalized by ``disk_peak_bps``
  (bytes/s, default 1 GB/s).
- ``tcp_retrans``: the share of TCP segments the namespace retransmitted over the window, one
  sample (``perftracker.agent.samplers.tcp``, from ``/proc/<pid>/net/snmp``).
NIC, disk and TCP counters are read every ``slow_every`` ticks (10 ms by default). psutil reads the
disk counters; it has no per-thread run time or run delay (schedstat, perf task-clock), and its NIC
counters are those of the caller's network namespace, not the target's, so those are read here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
from perftracker.agent.samplers.base import WindowBounds, rate_series
from perftracker.agent.samplers.cpuwait import RESOURCE as WAIT_RESOURCE
from perftracker.agent.samplers.cpuwait import cpu_wait_series
from perftracker.agent.samplers.taskclock import (
    TaskClockUnavailable,
    open_task_clock,
    read_task_clock,
)
from perftracker.agent.samplers.tcp import RESOURCE as TCP_RESOURCE
from perftracker.agent.samplers.tcp import parse_snmp_tcp, window_retrans_share

from perftracker.errors import ConfigError
from perftracker.model.raw_window import UtilSeries

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcfsOptions:
    period_us: int = 1000
    slow_every: int = 10
    nic_peak_bps: float = 10e9  # bits/s, for interfaces without /sys/class/net/<if>/speed
    disk_peak_bps: float = 1e9  # bytes/s
    proc_root: str = "/proc"
    sys_net_root: str = "/sys/class/net"
    cpu_source: str = "auto"  # "auto": perf task-clock if permitted, else schedstat; "schedstat": force it
    max_read_us: int = 200  # drop a cpu reading whose clock bracket is wider (sampler preempted)

    def __post_init__(self) -> None:
        if self.cpu_source not in CPU_SOURCES:
            raise ConfigError(f"ProcfsOptions.cpu_source: {self.cpu_source!r} is not one of {', '.join(CPU_SOURCES)}")


CPU_SOURCES = ("auto", "schedstat")


def cpu_utilization(t_ns: np.ndarray, run_ns: np.ndarray, period_ns: int, source: str = "schedstat") -> UtilSeries:
    """Thread CPU utilization per sample interval from (time, cumulative run time) readings.

    See the module docstring for why increases are back-filled. value[i] covers (t[i-1], t[i]].
    """
    t = np.asarray(t_ns, dtype=np.int64)
    r = np.asarray(run_ns, dtype=np.int64)
    if len(t) < 2:
        return UtilSeries("cpu", np.zeros(0, np.int64), np.zeros(0, np.float32), period_ns, source)
    idx = np.nonzero(np.diff(r) > 0)[0] + 1
    delta = r[idx] - r[idx - 1]
    # The update happened somewhere in (t[i-1], t[i]]: take the midpoint, but no earlier than the
    # previous update plus the Δ ns run between the two (a thread running flat out would otherwise
    # get overlapping runs, and lose run time to the clip at 100 %).
    mid = ((t[idx - 1] + t[idx]) // 2).tolist()
    hi = t[idx].tolist()
    upd_list: list[int] = []
    prev = int(t[0])
    for m, h, d in zip(mid, hi, delta.tolist(), strict=True):
        prev = min(max(m, prev + d), h)
        upd_list.append(prev)
    upd_t = np.array(upd_list, dtype=np.int64)
    prev_t = np.concatenate(([t[0]], upd_t[:-1])) if len(idx) else np.zeros(0, np.int64)
    run_start = np.maximum(upd_t - delta, prev_t)
    xp = np.empty(1 + 2 * len(idx), dtype=np.float64)
    fp = np.empty_like(xp)
    xp[0], fp[0] = t[0], r[0]
    xp[1::2], fp[1::2] = run_start, r[idx - 1]
    xp[2::2], fp[2::2] = upd_t, r[idx]
    cum = np.interp(t.astype(np.float64), xp, fp)
    dt = np.diff(t).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(dt > 0, np.diff(cum) / dt, 0.0)
    return UtilSeries("cpu", t[1:], np.clip(util, 0.0, 1.0).astype(np.float32), period_ns, source)


def exact_cpu_utilization(t_ns: np.ndarray, run_ns: np.ndarray, period_ns: int, source: str = "perf") -> UtilSeries:
    """Thread CPU utilization from exact (time, cumulative run time) readings: Δrun / Δt per interval."""
    return rate_series("cpu", t_ns, run_ns, 1e9, period_ns, source)


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/net/dev`` -> {interface: (rx_bytes, tx_bytes)}."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines()[2:]:
        if ":" not in line:
            continue
        name, rest = line.split(":", 1)
        fields = rest.split()
        if len(fields) >= 9:
            out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


def disk_bytes(proc: psutil.Process) -> int:
    """The bytes the process read from and wrote to the storage layer (psutil.Error if unreadable)."""
    io = proc.io_counters()
    return int(io.read_bytes) + int(io.write_bytes)


def link_peak_bytes_per_s(iface: str, options: ProcfsOptions) -> float:
    """Link speed in bytes/s from sysfs (Mbit/s there), else options.nic_peak_bps / 8."""
    try:
        mbps = int(Path(options.sys_net_root, iface, "speed").read_text().strip())
        if mbps > 0:
            return mbps * 1e6 / 8
    except (OSError, ValueError):
        pass
    return options.nic_peak_bps / 8


def _read(fd: int) -> bytes:
    return os.pread(fd, 65536, 0)


_logged_sources: set[str] = set()


def _log_once(level: int, msg: str, *args: object) -> None:
    """Log a source decision once per process (standby sampler processes run many windows)."""
    key = msg % args
    if key not in _logged_sources:
        _logged_sources.add(key)
        log.log(level, msg, *args)
    else:
        log.debug(msg, *args)


class CpuCounter:
    """The training thread's cumulative run time in ns, from perf task-clock or from schedstat."""

    def __init__(self, schedstat_path: str, tid: int, source: str = "auto") -> None:
        self._sched_fd = os.open(schedstat_path, os.O_RDONLY)
        self._perf_fd: int | None = None
        self.source = "schedstat"
        if source == "auto":
            try:
                self._perf_fd = open_task_clock(tid)
                self.source = "perf"
                _log_once(logging.INFO, "procfs sampler: cpu source perf (PERF_COUNT_SW_TASK_CLOCK, exact)")
            except TaskClockUnavailable as exc:
                _log_once(logging.WARNING, "procfs sampler: cpu source schedstat (tick-granular, rebuilt): %s", exc)
        else:
            _log_once(logging.INFO, "procfs sampler: cpu source schedstat (forced by cpu_source)")

    def read(self) -> tuple[int, int]:
        """(cumulative run ns, cumulative run_delay ns). The run time comes from the perf counter
        when it is open, else from schedstat's first field; the wait for a core always from
        schedstat's second (``perftracker.agent.samplers.cpuwait``), which also fails once the thread is gone
        (OSError/ValueError/IndexError), as the perf counter outlives its thread."""
        fields = _read(self._sched_fd).split()
        if self._perf_fd is not None:
            return read_task_clock(self._perf_fd), int(fields[1])
        return int(fields[0]), int(fields[1])

    def close(self) -> None:
        os.close(self._sched_fd)
        if self._perf_fd is not None:
            os.close(self._perf_fd)
            self._perf_fd = None


class ProcfsSampler:
    """Samples one thread's CPU time, the NICs and the process's disk bytes from procfs."""

    name = "procfs"

    def __init__(self, pid: int, tid: int, options: ProcfsOptions | None = None) -> None:
        self.pid = pid
        self.tid = tid
        self.options = options or ProcfsOptions()
        self._cpu: CpuCounter | None = None

    def _path(self, *parts: str) -> str:
        return os.path.join(self.options.proc_root, str(self.pid), *parts)

    def unavailable_reason(self) -> str | None:
        """None if the thread's CPU counter opens; it is kept for ``run`` so that sampling starts
        at once (the sampler process says ``ready`` after this)."""
        path = self._path("task", str(self.tid), "schedstat")
        if not os.path.exists(path):
            return f"{path} does not exist (no such thread, or no procfs)"
        if self._cpu is None:
            try:
                self._cpu = CpuCounter(path, self.tid, self.options.cpu_source)
            except OSError as exc:
                return f"{path}: {exc}"
        return None

    def run(self, bounds: WindowBounds) -> Mapping[str, UtilSeries]:
        opt = self.options
        period_ns = opt.period_us * 1000
        max_read_ns = opt.max_read_us * 1000
        cpu = self._cpu or CpuCounter(self._path("task", str(self.tid), "schedstat"), self.tid, opt.cpu_source)
        self._cpu = None  # one run per counter: closed below
        fds: dict[str, int] = {}
        for key, rel in (("net", ("net", "dev")), ("snmp", ("net", "snmp"))):
            try:
                fds[key] = os.open(self._path(*rel), os.O_RDONLY)
            except OSError as exc:
                log.info("procfs sampler: no %s (%s)", "/".join(rel), exc)
        io_proc: psutil.Process | None = None
        try:
            io_proc = psutil.Process(self.pid)
            disk_bytes(io_proc)
        except psutil.Error as exc:
            log.info("procfs sampler: no disk counters (%s)", exc)
            io_proc = None
        cpu_t: list[int] = []
        cpu_run: list[int] = []
        cpu_wait: list[int] = []
        slow_t: list[int] = []
        net: list[dict[str, tuple[int, int]]] = []
        disk_t: list[int] = []
        disk: list[int] = []
        tcp_t: list[int] = []
        tcp: list[tuple[int, int]] = []
        dropped = 0
        try:
            if not bounds.wait_for_start():
                return {}
            tick = 0
            next_ns = time.monotonic_ns()
            while True:
                t0 = time.monotonic_ns()
                if bounds.done(t0):
                    break
                try:
                    run, wait = cpu.read()
                except (OSError, ValueError, IndexError):
                    log.info("procfs sampler: thread %d gone, stopping", self.tid)
                    break
                t1 = time.monotonic_ns()
                if t1 - t0 <= max_read_ns:
                    cpu_t.append((t0 + t1) // 2)
                    cpu_run.append(run)
                    cpu_wait.append(wait)
                else:
                    dropped += 1
                if tick % opt.slow_every == 0:
                    slow_t.append(t1)
                    if "net" in fds:
                        net.append(parse_net_dev(_read(fds["net"]).decode(errors="replace")))
                    if io_proc is not None:
                        try:
                            disk.append(disk_bytes(io_proc))
                            disk_t.append(t1)
                        except psutil.Error as exc:  # the process ended: keep what was read
                            log.info("procfs sampler: disk counters gone (%s)", exc)
                            io_proc = None
                    if "snmp" in fds:
                        try:
                            tcp.append(parse_snmp_tcp(_read(fds["snmp"]).decode(errors="replace")))
                            tcp_t.append(t1)
                        except (ValueError, KeyError) as exc:
                            log.info("procfs sampler: no TCP counters in net/snmp (%s)", exc)
                            os.close(fds.pop("snmp"))
                tick += 1
                next_ns += period_ns
                sleep_ns = next_ns - time.monotonic_ns()
                if sleep_ns > 0:
                    time.sleep(sleep_ns / 1e9)
                else:
                    next_ns = time.monotonic_ns()  # fell behind (CPU contention): do not burst
        finally:
            cpu.close()
            for fd in fds.values():
                os.close(fd)
        out: dict[str, UtilSeries] = {}
        ct, cr = np.array(cpu_t, np.int64), np.array(cpu_run, np.int64)
        if len(ct) > 1:
            log.info("procfs sampler: cpu (%s) %d readings over %.2f s, %d dropped (read took > %d us), largest gap %.1f ms",
                     cpu.source, len(ct), (ct[-1] - ct[0]) / 1e9, dropped, opt.max_read_us, np.diff(ct).max() / 1e6)
        if cpu.source == "perf":
            out["cpu"] = exact_cpu_utilization(ct, cr, period_ns, "perf")
        else:
            out["cpu"] = cpu_utilization(ct, cr, period_ns, "schedstat")
        out[WAIT_RESOURCE] = cpu_wait_series(ct, cr, np.array(cpu_wait, np.int64), period_ns, "schedstat")
        slow_period_ns = period_ns * opt.slow_every
        st = np.array(slow_t, np.int64)
        if net:
            out.update(self._nic_series(st, net, slow_period_ns))
        if disk:
            out["disk"] = rate_series("disk", np.array(disk_t, np.int64), np.array(disk, np.float64), opt.disk_peak_bps,
                                      slow_period_ns, "procfs")
        if tcp:
            counts = np.array(tcp, np.int64)
            share = window_retrans_share(np.array(tcp_t, np.int64), counts[:, 0], counts[:, 1], bounds.start_ns,
                                         bounds.end_ns)
            if share is not None:
                out[TCP_RESOURCE] = share
        return {k: bounds.trim(v) for k, v in out.items()}

    def _nic_series(self, t: np.ndarray, net: list[dict[str, tuple[int, int]]], period_ns: int) -> dict[str, UtilSeries]:
        out: dict[str, UtilSeries] = {}
        ifaces = sorted(set().union(*[set(n) for n in net]))
        for iface in ifaces:
            peak = link_peak_bytes_per_s(iface, self.options)
            rx = np.array([n.get(iface, (0, 0))[0] for n in net], np.float64)
            tx = np.array([n.get(iface, (0, 0))[1] for n in net], np.float64)
            srx = rate_series("nic", t, rx, peak, period_ns, "procfs")
            stx = rate_series("nic", t, tx, peak, period_ns, "procfs")
            out[f"nic:{iface}"] = UtilSeries(f"nic:{iface}", srx.t_ns, np.maximum(srx.value, stx.value), period_ns, "procfs")
        if out:
            first = next(iter(out.values()))
            stacked = np.vstack([s.value for s in out.values()])
            out["nic"] = UtilSeries("nic", first.t_ns, stacked.max(axis=0), period_ns, "procfs")
        return out
