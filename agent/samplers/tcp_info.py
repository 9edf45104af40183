"""The kernel's own evidence on each TCP connection of the training processes (issue 44).

Gloo jobs and NCCL over sockets have no RDMA counters; the only per-connection evidence of a slow
link is what the kernel keeps per socket (``struct tcp_info``): the smoothed RTT, the segments
retransmitted, the delivery rate, the pacing rate, the congestion window, the bytes still queued
to send. ``ss -tinp`` prints it for every socket with the process that holds it; this module
parses that text (pure: ``parse_ss``), reads it for a set of processes (I/O: ``read_connections``,
one ``ss`` run of the namespace per reading), and reduces a window's readings to one record per
connection (pure: ``window_links``) and to the connection that stands apart from the rank's others
(``slowest_link``).

Units: times in ms as ``ss`` prints them, rates in bit/s, queues and byte counts in bytes.
``ss`` reads the sockets of its own network namespace: the sampler runs in the training
processes' namespace (the node agent's sampler process does: it is started beside the workers).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from perftracker.agent.samplers.base import WindowBounds

from perftracker.model.raw_window import TCP_RETRANS, UtilSeries

log = logging.getLogger(__name__)

SS_ARGS = ("ss", "-tinpH", "state", "established")
SS_TIMEOUT_S = 2.0
_RATE = re.compile(r"^([0-9.]+)([KMG]?)bps$")
_UNIT = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9}
_PID = re.compile(r"pid=(\d+)")
_STATES = {"ESTAB", "SYN-SENT", "SYN-RECV", "FIN-WAIT-1", "FIN-WAIT-2", "TIME-WAIT", "CLOSE-WAIT", "LAST-ACK",
           "LISTEN", "CLOSING", "UNCONN"}


@dataclass(frozen=True)
class TcpConn:
    """One reading of one connection (None: ``ss`` did not print the field)."""

    local: str
    peer: str
    pids: tuple[int, ...]
    recv_q: int
    send_q: int  # bytes not yet acknowledged by the peer
    rtt_ms: float | None = None
    rttvar_ms: float | None = None
    retrans_total: int | None = None  # segments retransmitted over the connection's life
    bytes_sent: int | None = None
    bytes_retrans: int | None = None
    bytes_acked: int | None = None
    delivery_rate_bps: float | None = None
    pacing_rate_bps: float | None = None
    cwnd: int | None = None
    notsent: int | None = None  # bytes the application queued that TCP has not sent yet

    @property
    def key(self) -> tuple[str, str]:
        return self.local, self.peer


def _rate(tok: str) -> float | None:
    m = _RATE.match(tok)
    return float(m.group(1)) * _UNIT[m.group(2)] if m else None


def _int(v: str) -> int | None:
    try:
        return int(v)
    except ValueError:
        return None


def _info(tokens: Sequence[str]) -> dict[str, float | int | None]:
    """The tcp_info line: ``key:value`` tokens, and ``send``/``pacing_rate``/``delivery_rate``
    followed by a rate token."""
    out: dict[str, float | int | None] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in ("pacing_rate", "delivery_rate") and i + 1 < len(tokens):
            out[tok] = _rate(tokens[i + 1])
            i += 2
            continue
        k, sep, v = tok.partition(":")
        if sep:
            if k == "rtt":
                a, _, b = v.partition("/")
                try:
                    out["rtt"], out["rttvar"] = float(a), float(b) if b else None
                except ValueError:
                    pass
            elif k == "retrans":  # current/total
                out["retrans"] = _int(v.partition("/")[2] or v)
            elif k in ("bytes_sent", "bytes_retrans", "bytes_acked", "cwnd", "notsent"):
                out[k] = _int(v)
        i += 1
    return out


def parse_ss(text: str) -> list[TcpConn]:
    """``ss -tinpH`` (or ``-tinH``, with or without a state filter) -> its connections. A socket
    line (queues, addresses, the holding processes) is followed by an indented tcp_info line; a
    line that is neither is skipped."""
    out: list[TcpConn] = []
    head: tuple[str, str, tuple[int, ...], int, int] | None = None

    def flush(info: dict[str, float | int | None]) -> None:
        if head is None:
            return
        local, peer, pids, rq, sq = head

        def f(k: str) -> float | None:
            v = info.get(k)
            return float(v) if v is not None else None

        def n(k: str) -> int | None:
            v = info.get(k)
            return int(v) if v is not None else None

        out.append(TcpConn(local, peer, pids, rq, sq, f("rtt"), f("rttvar"), n("retrans"), n("bytes_sent"),
                           n("bytes_retrans"), n("bytes_acked"), f("delivery_rate"), f("pacing_rate"), n("cwnd"),
                           n("notsent")))

    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0] in " \t":  # the tcp_info line of the socket above
            flush(_info(line.split()))
            head = None
            continue
        if head is not None:  # a socket without an info line
            flush({})
        toks = line.split()
        if toks and toks[0] in _STATES:
            toks = toks[1:]
        if len(toks) < 4 or _int(toks[0]) is None or _int(toks[1]) is None:
            head = None
            continue
        pids = tuple(int(p) for p in _PID.findall(" ".join(toks[4:])))
        head = (toks[2], toks[3], pids, int(toks[0]), int(toks[1]))
    if head is not None:
        flush({})
    return out


def read_connections(pids: Collection[int], args: Sequence[str] = SS_ARGS) -> list[TcpConn]:
    """The established TCP connections held by these processes, as the kernel reports them now
    (one ``ss`` run). [] when ``ss`` is missing or fails (logged once by the caller's sampler)."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=SS_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("ss failed: %s", exc)
        return []
    if done.returncode != 0:
        log.debug("ss exited %d: %s", done.returncode, done.stderr.strip()[:200])
        return []
    want = set(pids)
    return [c for c in parse_ss(done.stdout) if want.intersection(c.pids)]


@dataclass(frozen=True)
class LinkWindow:
    """One connection over a window: what the kernel saw between its first and last reading."""

    local: str
    peer: str
    readings: int
    rtt_ms: float  # median smoothed RTT over the readings
    retrans_segs: int  # segments retransmitted in the window
    retrans_share: float  # bytes retransmitted / bytes sent in the window (0 when none sent)
    sent_bytes: int
    delivery_rate_bps: float  # median (0: never reported)
    send_q_max: int  # the most bytes waiting for the peer's acknowledgement


def window_links(readings: Sequence[Sequence[TcpConn]]) -> list[LinkWindow]:
    """Per connection seen in at least two readings (in time order), its window record."""
    series: dict[tuple[str, str], list[TcpConn]] = {}
    for r in readings:
        for c in r:
            series.setdefault(c.key, []).append(c)
    out = []
    for (local, peer), cs in series.items():
        if len(cs) < 2:
            continue
        first, last = cs[0], cs[-1]
        rtts = [c.rtt_ms for c in cs if c.rtt_ms is not None]
        rates = [c.delivery_rate_bps for c in cs if c.delivery_rate_bps is not None]
        sent = max(0, (last.bytes_sent or 0) - (first.bytes_sent or 0))
        again = max(0, (last.bytes_retrans or 0) - (first.bytes_retrans or 0))
        segs = max(0, (last.retrans_total or 0) - (first.retrans_total or 0))
        out.append(LinkWindow(local, peer, len(cs), float(np.median(rtts)) if rtts else 0.0, segs,
                              again / sent if sent else 0.0, sent, float(np.median(rates)) if rates else 0.0,
                              max(c.send_q for c in cs)))
    return out


RTT_APART = 4.0  # a connection's RTT this many times its rank's median connection's is its own
MIN_RTT_MS = 1.0  # and at least this long (a loopback's 0.05 ms against 0.02 ms is no slow link)


def slowest_link(links: Sequence[LinkWindow]) -> LinkWindow | None:
    """The connection that stands apart from the process's others: its RTT ``RTT_APART`` times
    their median's and at least ``MIN_RTT_MS``; with a single connection, one whose RTT is at least
    ``MIN_RTT_MS`` and that retransmitted. None when no connection stands apart."""
    busy = [x for x in links if x.sent_bytes > 0] or list(links)
    if not busy:
        return None
    if len(busy) == 1:
        x = busy[0]
        return x if x.rtt_ms >= MIN_RTT_MS and x.retrans_segs > 0 else None
    worst = max(busy, key=lambda x: x.rtt_ms)
    others = float(np.median([x.rtt_ms for x in busy if x is not worst]))
    if worst.rtt_ms >= MIN_RTT_MS and worst.rtt_ms >= RTT_APART * max(others, 1e-3):
        return worst
    return None


MIN_SENT_BYTES = 1 << 20  # a retransmitted share of less than a MiB sent in the window says nothing
PERIOD_S = 0.5  # one reading every half second (one ss run: ~40 ms on a loaded host)


def retrans_share(links: Sequence[LinkWindow], min_sent: int = MIN_SENT_BYTES) -> float | None:
    """The bytes the process's own connections retransmitted over those they sent in the window;
    None below ``min_sent`` bytes sent."""
    sent = sum(x.sent_bytes for x in links)
    if sent < min_sent:
        return None
    return min(1.0, sum(x.retrans_share * x.sent_bytes for x in links) / sent)


def netns_args(pid: int) -> tuple[str, ...]:
    """``ss`` in the process's network namespace: as is where it is this process's own, else through
    ``nsenter --net`` (an emulated host, a pod)."""
    try:
        same = os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
    except OSError:
        same = True  # cannot tell (the process is gone, or no permission): read this namespace
    return SS_ARGS if same else ("nsenter", f"--net=/proc/{pid}/ns/net", *SS_ARGS)


class TcpInfoSampler:
    """The training process's own TCP connections over a window (opt-in sampler name ``tcp_info``):
    their retransmitted share of bytes replaces the namespace-wide ``tcp_retrans`` of /proc/net/snmp
    (listed after procfs, its series wins the merge), so ranks that share a host or namespace are
    told apart by their own links. Readings every ``PERIOD_S`` from the window's start to its end."""

    name = "tcp_info"

    def __init__(self, pid: int, period_s: float = PERIOD_S) -> None:
        self.pid = pid
        self.period_s = period_s

    def unavailable_reason(self) -> str | None:
        return None if shutil.which("ss") else "iproute2's ss is not installed"

    def run(self, bounds: WindowBounds) -> Mapping[str, UtilSeries]:
        if not bounds.wait_for_start():
            return {}
        args = netns_args(self.pid)
        readings: list[list[TcpConn]] = []
        t_ns: list[int] = []
        while True:
            now = time.monotonic_ns()
            readings.append(read_connections({self.pid}, args))
            t_ns.append(now)
            if bounds.done(now):
                break
            time.sleep(self.period_s)
        share = retrans_share(window_links(readings))
        if share is None or len(t_ns) < 2:
            return {}
        return {TCP_RETRANS: UtilSeries(TCP_RETRANS, np.array([t_ns[-1]], np.int64), np.array([share], np.float32),
                                        int(t_ns[-1] - t_ns[0]), "tcp_info")}
