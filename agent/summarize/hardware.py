"""Hardware evidence in the summary (issue 34). Pure numpy over a worker's samples.

- ``clock_pattern``: the GPU's SM clock against its maximum while compute kernels hold the
  critical path, and the throttle reasons then, as one compute pattern (``GPU_CLOCK_KEY``). NVML
  utilization is the share of time a kernel ran, so a GPU at half its clock still reads ~100%; the
  clock is what shows a throttled GPU, even one whose β is unchanged (a host-bound job).
- ``ib_wait_pattern``: the rank's InfiniBand port health (``port_xmit_wait`` share, link errors) as
  one collective pattern (``IB_WAIT_KEY``): a slow link inside a single group, where every member
  of the group waits the same and the traces cannot tell which link is slow.
- ``p2p_pattern``: the share of a rank's intra-host collective traffic that went over PCIe, not
  NVLink (``P2P_PCIE_KEY``): a PCIe fallback, where every member of the ring slows alike.
- ``link_series``: the series a collective is measured against, from its group's members and
  their hosts: NVLink (or PCIe peer-to-peer without NVLink traffic) inside a host, the rank's NIC
  between hosts.

NOT VERIFIED ON HARDWARE: the series come from agent/samplers/nvml.py and agent/samplers/rdma.py,
tested on fixtures in NVML's and sysfs's formats only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from perftracker.model import Category, Pattern
from perftracker.model.hardware import (
    GPU_CLOCK_KEY,
    IB_WAIT_KEY,
    IB_XMIT_WAIT,
    NVLINK,
    P2P_PCIE_KEY,
    PCIE,
    SM_CLOCK,
    THROTTLE_SERIES,
    THROTTLE_TEXT,
    max_label,
    max_mhz_of,
    reason_key,
)
from perftracker.model.raw_window import SampleSet, UtilSeries

ACTIVE_MIN = 0.05  # a port busy (sending or stalled) at least this share of a sample interval


def _inside(t_ns: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Mask of the sample times that fall inside any of the intervals."""
    if not len(start_ns) or not len(t_ns):
        return np.zeros(len(t_ns), dtype=bool)
    order = np.argsort(start_ns, kind="stable")
    s, e = np.asarray(start_ns)[order], np.maximum.accumulate(np.asarray(end_ns)[order])
    k = np.searchsorted(s, t_ns, side="right") - 1
    ok = k >= 0
    out = np.zeros(len(t_ns), dtype=bool)
    out[ok] = t_ns[ok] <= e[k[ok]]
    return out


def _scope(series: UtilSeries, start_ns: np.ndarray, end_ns: np.ndarray, lo_ns: int, hi_ns: int) -> np.ndarray:
    """The samples while compute runs; all the window's samples when none falls inside compute."""
    t = np.asarray(series.t_ns, dtype=np.int64)
    m = _inside(t, start_ns, end_ns)
    if not m.any():
        m = (t >= lo_ns) & (t <= hi_ns)
    return m


def clock_patterns(samples: SampleSet | None, compute_start_ns: np.ndarray, compute_end_ns: np.ndarray,
                   compute_ns: float, window_start_ns: int, window_end_ns: int) -> list[Pattern]:
    """The SM clock pattern of one worker and one pattern per throttle reason class whose series
    exists; none without an ``sm_clock`` series."""
    clock = samples.get(SM_CLOCK) if samples is not None else None
    if clock is None or not len(clock.t_ns):
        return []
    m = _scope(clock, compute_start_ns, compute_end_ns, window_start_ns, window_end_ns)
    if not m.any():
        return []
    v = np.clip(np.asarray(clock.value, dtype=np.float64)[m], 0.0, 1.0)
    mu, sigma = float(v.mean()), float(v.std())
    t_lo, t_hi = int(clock.t_ns[m].min()), int(clock.t_ns[m].max())
    window_ns = max(window_end_ns - window_start_ns, 1)
    beta = float(min(compute_ns / window_ns, 1.0))
    crit = int(round(compute_ns))
    out = [Pattern(key=GPU_CLOCK_KEY, category=Category.COMPUTE, beta=beta, mu=mu, sigma=sigma,
                   label=max_label(max_mhz_of(clock.source) / 1000.0), executions=0, critical_ns=crit,
                   resource=SM_CLOCK)]
    for name in THROTTLE_SERIES:
        s = samples.get(name) if samples is not None else None
        if s is None or not len(s.t_ns):
            continue
        sel = (s.t_ns >= t_lo) & (s.t_ns <= t_hi)
        share = float((np.asarray(s.value)[sel] > 0.5).mean()) if sel.any() else 0.0
        key = reason_key(THROTTLE_TEXT[name])
        out.append(Pattern(key=key, category=Category.COMPUTE, beta=beta, mu=share, sigma=0.0, label=key,
                           executions=0, critical_ns=crit, resource=name))
    return out


def ib_wait_pattern(samples: SampleSet | None, start_ns: np.ndarray, end_ns: np.ndarray, collective_ns: float,
                    window_start_ns: int, window_end_ns: int) -> Pattern | None:
    """The InfiniBand port pattern of one worker, or None without an ``ib_xmit_wait`` series.

    μ is the share of the port's active time it was stalled, while the worker's collectives over the
    NIC (``start_ns``/``end_ns``) run: xmit-wait / (xmit-wait + sending), sending being the ``nic``
    utilization of the same interval. Time the rank spends waiting for a late peer (the port idle)
    counts in neither, so a slow link is not diluted by the job's other waits. Without a ``nic``
    series, the plain xmit-wait share of that time. σ: its spread over the samples."""
    wait = samples.get(IB_XMIT_WAIT) if samples is not None else None
    if wait is None or not len(wait.t_ns):
        return None
    m = _scope(wait, start_ns, end_ns, window_start_ns, window_end_ns)
    if not m.any():
        return None
    w = np.clip(np.asarray(wait.value, dtype=np.float64)[m], 0.0, 1.0)
    nic = samples.get("nic") if samples is not None else None
    if nic is not None and len(nic.t_ns):
        u = np.interp(np.asarray(wait.t_ns)[m], np.asarray(nic.t_ns), np.asarray(nic.value, dtype=np.float64))
        active = (w + u) > ACTIVE_MIN
        v = w[active] / (w[active] + u[active]) if active.any() else np.zeros(1)
    else:
        v = w
    window_ns = window_end_ns - window_start_ns
    return Pattern(key=IB_WAIT_KEY, category=Category.COLLECTIVE,
                   beta=float(min(collective_ns / max(window_ns, 1), 1.0)), mu=float(v.mean()), sigma=float(v.std()),
                   label=IB_WAIT_KEY, executions=0, critical_ns=int(round(collective_ns)), resource=IB_XMIT_WAIT)


def p2p_pattern(samples: SampleSet | None, start_ns: np.ndarray, end_ns: np.ndarray, collective_ns: float,
                window_ns: int) -> Pattern | None:
    """The PCIe share of the link traffic while intra-host collectives run (both ``nvlink`` and
    ``pcie`` series needed: a host without NVLink has nothing to fall back from)."""
    if samples is None or not len(start_ns):
        return None
    nvl, pcie = samples.get(NVLINK), samples.get(PCIE)
    if nvl is None or pcie is None or not len(nvl.t_ns) or not len(pcie.t_ns):
        return None
    m = _inside(np.asarray(pcie.t_ns, dtype=np.int64), start_ns, end_ns)
    if not m.any():
        return None
    p = np.asarray(pcie.value, dtype=np.float64)[m]
    n = np.interp(np.asarray(pcie.t_ns)[m], np.asarray(nvl.t_ns), np.asarray(nvl.value, dtype=np.float64))
    total = p + n
    busy = total > 0.02
    if not busy.any():
        return None
    share = p[busy] / total[busy]
    return Pattern(key=P2P_PCIE_KEY, category=Category.COLLECTIVE,
                   beta=float(min(collective_ns / max(window_ns, 1), 1.0)), mu=float(share.mean()),
                   sigma=float(share.std()), label=P2P_PCIE_KEY, executions=0, critical_ns=int(round(collective_ns)),
                   resource=PCIE)


def host_of(rank: int, local_world_size: int) -> int:
    """The host index of a rank when ranks fill hosts in order (torchrun's layout)."""
    return rank // local_world_size


def crosses_hosts(members: Iterable[int], local_world_size: int) -> bool | None:
    """Whether a group's members sit on more than one host; None when the layout is unknown."""
    if isinstance(members, range) and local_world_size > 0 and members.step > 0:  # O(1): increasing
        return None if not members else host_of(members[0], local_world_size) != host_of(members[-1], local_world_size)
    ms = list(members)
    if local_world_size <= 0 or not ms:
        return None
    return len({host_of(r, local_world_size) for r in ms}) > 1


def link_series(samples: SampleSet | None, group_members: Sequence[Sequence[int]], local_world_size: int,
                own_rank: int) -> tuple[str, ...]:
    """The series a collective's μ/σ come from, first present wins.

    Between hosts (any of its groups spans several hosts): the NIC. Inside the host: NVLink, then
    PCIe (peer-to-peer without NVLink). Unknown groups or layout: NVLink, then the NIC, as before.
    """
    if not group_members or local_world_size <= 0:
        return (NVLINK, "nic")
    spans = [crosses_hosts(m if len(m) else [own_rank], local_world_size) for m in group_members]
    if any(spans):
        return ("nic",)
    return (NVLINK, PCIE)
