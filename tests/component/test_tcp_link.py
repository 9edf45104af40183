"""The host link's TCP health: the snmp counters, the window's retransmitted share, the summarizer's
link pattern and the localizer's finding, and the counters of a real namespace."""

from __future__ import annotations

import os

import numpy as np
import pytest
from perftracker.agent.samplers.tcp import MIN_SEGMENTS, parse_snmp_tcp, window_retrans_share
from perftracker.agent.summarize.summarizer import LINK_KEY, summarize_window
from perftracker.localizer.diagnose.localize import localize

from perftracker.model import Category, Pattern, PatternSet
from perftracker.model.raw_window import EventKind as K
from perftracker.model.raw_window import SampleSet, UtilSeries
from tests.rawbuild import TRAIN_TID as T
from tests.rawbuild import by_key, raw_window

MS = 1_000_000
SNMP = """Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 100
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 60582 68247 580 108 4 18175319 18162894 5903 0 662 0
Udp: InDatagrams NoPorts
Udp: 1 2
"""


def test_parse_snmp_tcp() -> None:
    assert parse_snmp_tcp(SNMP) == (18162894, 5903)
    with pytest.raises(ValueError):
        parse_snmp_tcp("Ip: Forwarding\nIp: 1\n")


def test_parse_the_real_counters_of_this_namespace() -> None:
    with open(f"/proc/{os.getpid()}/net/snmp") as fh:
        out, retrans = parse_snmp_tcp(fh.read())
    assert out >= 0 and 0 <= retrans


def test_window_share_uses_the_readings_that_bracket_the_window() -> None:
    t = np.arange(0, 11) * 10 * MS  # readings every 10 ms
    out = np.arange(0, 11) * 1000  # 1,000 segments per 10 ms
    retrans = np.zeros(11, np.int64)
    retrans[3:] = 5  # 5 before the window
    retrans[6:] = 25  # 20 inside it
    s = window_retrans_share(t, out, retrans, 35 * MS, 75 * MS)
    # bracketing readings: 30 ms and 80 ms: 5,000 segments out, 20 retransmitted
    assert s is not None and s.resource == "tcp_retrans"
    assert float(s.value[0]) == pytest.approx(20 / 5000) and s.period_ns == 50 * MS and s.t_ns.tolist() == [80 * MS]
    # too few segments, or no reading after the start: nothing
    assert window_retrans_share(t, np.arange(11) * (MIN_SEGMENTS // 20), retrans, 35 * MS, 75 * MS) is None
    assert window_retrans_share(t[:1], out[:1], retrans[:1], 0, 5 * MS) is None


def test_summarizer_adds_the_link_pattern_over_the_collectives_time() -> None:
    raw = raw_window([(K.CPU_OP, "aten::addmm", T, 0, 30 * MS), (K.CPU_OP, "gloo:all_reduce", T, 30 * MS, 80 * MS)],
                     window=(0, 100 * MS))
    link = UtilSeries("tcp_retrans", np.array([100 * MS]), np.array([0.014], np.float32), 100 * MS, "fixture")
    got = by_key(summarize_window(raw, SampleSet({"tcp_retrans": link})))
    p = got[LINK_KEY]
    assert p.category is Category.COLLECTIVE and p.resource == "tcp_retrans"
    assert p.beta == pytest.approx(0.5) and p.mu == pytest.approx(0.014) and p.sigma == 0
    assert LINK_KEY not in by_key(summarize_window(raw, None))


def _sets(shares: list[float]) -> list[PatternSet]:
    ar = "ddp.reducer::wait (allreduce, in autograd engine)"
    return [PatternSet(job="j", session="s", rank=r, world_size=4, host=f"h{r}", gpu=False, window_start_ns=0,
                       window_end_ns=5 * 10**9,
                       patterns=(Pattern(LINK_KEY, Category.COLLECTIVE, 0.45, m, 0.0, label=LINK_KEY, resource="tcp_retrans"),
                                 Pattern(ar, Category.COLLECTIVE, 0.45, 0.1, 0.05, label=ar, resource="nic")))
            for r, m in enumerate(shares)]


def test_the_host_that_retransmits_is_named_and_healthy_links_are_quiet() -> None:
    # measured shape (2,000 Mbit/s tc limit on rank 1's host): 1.4% against 0.015-0.12%
    report = localize(_sets([0.0002, 0.014, 0.0012, 0.0003]))
    assert [(f.ranks, f.kind, f.tests) for f in report.findings] == [((1,), "specific", ("expectation",))]
    assert "retransmitted 1.4% of the host's TCP segments (expected ≤ 0.5%" in report.findings[0].sentence
    # the renderers label its μ as what it is
    import io

    from perftracker.localizer.render import write

    for fmt in ("text", "html"):
        buf = io.StringIO()
        write(report, fmt, buf)
        assert "retransmitted share" in buf.getvalue() and "\u03bc utilization" not in buf.getvalue(), fmt
    clean = localize(_sets([0.0002, 0.001, 0.0012, 0.0003]))
    assert clean.findings == ()
    # the pattern's β is the collectives' time: it is not listed as a function of its own
    assert [t.label for t in clean.top_functions] == ["ddp.reducer::wait (allreduce, in autograd engine)"]


def test_the_sampler_reports_the_share_over_a_real_window() -> None:
    """Real counters: TCP traffic over loopback during a real sampler window (the process's own
    namespace; other processes' segments count too, so only the shape is asserted)."""
    import socket
    import threading
    import time

    from perftracker.agent.samplers.base import WindowBounds
    from perftracker.agent.samplers.procfs import ProcfsSampler

    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn, _ = srv.accept()
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set():
            cli.sendall(b"x" * 64)
            conn.recv(65536)

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    try:
        now = time.monotonic_ns()
        series = ProcfsSampler(os.getpid(), threading.get_native_id()).run(WindowBounds(now + 50 * MS, now + 550 * MS))
    finally:
        stop.set()
        th.join()
        for s in (cli, conn, srv):
            s.close()
    link = series.get("tcp_retrans")
    assert link is not None and len(link.value) == 1
    assert 0.0 <= float(link.value[0]) < 0.05 and link.period_ns >= 500 * MS
