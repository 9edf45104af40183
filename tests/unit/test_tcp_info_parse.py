"""Parsing the kernel's per-connection TCP evidence as ``ss -tinpH`` prints it (issue 44;
agent/samplers/tcp_info.py). The text below is iproute2 6.1's output on this project's host for a
loopback pair whose reader stopped reading (copied as printed), plus a line without an info line and
the older K/M/G rate units."""

from __future__ import annotations

import pytest
from perftracker.agent.samplers.tcp_info import (
    LinkWindow,
    TcpConn,
    parse_ss,
    slowest_link,
    window_links,
)

SS = """\
0      3797504          127.0.0.1:35694          127.0.0.1:57795 users:(("python3",pid=8939,fd=4))
\t bbr wscale:10,10 rto:208 rtt:5.387/10.75 mss:47616 pmtu:65535 rcvmss:536 advmss:65483 cwnd:15 bytes_sent:160768 bytes_retrans:47616 bytes_acked:113153 segs_out:7 segs_in:3 data_segs_out:5 bbr:(bw:27209129880bps,mrtt:0.014,pacing_gain:2.88672,cwnd_gain:2.88672) send 1060686839bps lastsnd:136 lastrcv:144 lastack:100 pacing_rate 534679499600bps delivery_rate 27209142856bps delivered:6 app_limited busy:144ms rwnd_limited:144ms(100.0%) retrans:0/1 dsack_dups:1 reordering:6 rcv_space:65495 rcv_ssthresh:65495 notsent:3797504 minrtt:0.014 snd_wnd:15360
113152 0                127.0.0.1:57795          127.0.0.1:35694 users:(("python3",pid=8939,fd=5))
\t bbr wscale:10,10 rto:200 rtt:0.014/0.007 ato:80 mss:32768 pmtu:65535 rcvmss:47616 advmss:65483 cwnd:10 bytes_received:113152 segs_out:2 segs_in:7 data_segs_in:5 bbr:(bw:0bps,mrtt:0.014) send 187245714286bps lastsnd:144 lastrcv:144 lastack:136 pacing_rate 535120425240bps delivered:1 app_limited reordering:6 rcv_rtt:0.026 rcv_space:65483 rcv_ssthresh:95232 minrtt:0.014 snd_wnd:65536
ESTAB 0 0 [::ffff:10.0.0.1]:29500 [::ffff:10.0.0.2]:41000 users:(("torchrun",pid=77,fd=9),("python",pid=78,fd=9))
ESTAB 0 12 10.0.0.1:29501 10.0.0.3:41001
\t cubic rtt:25.1/3.2 cwnd:10 bytes_sent:1000 retrans:0/7 delivery_rate 12.5Mbps pacing_rate 1.2Gbps
"""


def test_the_real_format_is_read() -> None:
    conns = parse_ss(SS)
    assert len(conns) == 4
    a, b, c, d = conns
    assert (a.local, a.peer, a.pids, a.recv_q, a.send_q) == ("127.0.0.1:35694", "127.0.0.1:57795", (8939,), 0, 3797504)
    assert a.rtt_ms == pytest.approx(5.387) and a.rttvar_ms == pytest.approx(10.75)
    assert (a.bytes_sent, a.bytes_retrans, a.bytes_acked, a.cwnd, a.retrans_total, a.notsent) == \
        (160768, 47616, 113153, 15, 1, 3797504)
    assert a.delivery_rate_bps == pytest.approx(27209142856.0) and a.pacing_rate_bps == pytest.approx(534679499600.0)
    assert b.recv_q == 113152 and b.bytes_sent is None and b.delivery_rate_bps is None  # a receiver
    assert c.pids == (77, 78) and c.rtt_ms is None  # no info line: the socket is kept, its fields unknown
    assert d.pids == () and d.rtt_ms == pytest.approx(25.1) and d.retrans_total == 7
    assert d.delivery_rate_bps == pytest.approx(12.5e6) and d.pacing_rate_bps == pytest.approx(1.2e9)


def test_garbage_is_skipped_not_raised() -> None:
    assert parse_ss("Cannot open netlink socket: Permission denied\n\n\tcubic rtt:1/1\n") == []


def _conn(peer: str, rtt: float, sent: int, again: int, retrans: int) -> TcpConn:
    return TcpConn("10.0.0.1:1", peer, (1,), 0, 0, rtt_ms=rtt, bytes_sent=sent, bytes_retrans=again,
                   retrans_total=retrans, delivery_rate_bps=1e9)


def test_a_window_is_the_difference_of_its_readings_and_the_connection_apart_is_named() -> None:
    first = [_conn("b:1", 0.2, 0, 0, 0), _conn("c:1", 0.3, 0, 0, 0), _conn("d:1", 20.0, 0, 0, 0)]
    last = [_conn("b:1", 0.2, 10_000, 0, 0), _conn("c:1", 0.3, 10_000, 0, 0), _conn("d:1", 22.0, 10_000, 500, 3)]
    links = window_links([first, last, [_conn("e:1", 99.0, 1, 0, 0)]])  # e: one reading, no window
    assert sorted(x.peer for x in links) == ["b:1", "c:1", "d:1"]
    d = next(x for x in links if x.peer == "d:1")
    assert (d.sent_bytes, d.retrans_segs, d.retrans_share, d.rtt_ms) == (10_000, 3, 0.05, 21.0)
    assert slowest_link(links) is d


def _lw(peer: str, rtt: float, retrans: int = 0) -> LinkWindow:
    return LinkWindow("a:1", peer, 3, rtt, retrans, 0.0, 1000, 1e9, 0)


def test_near_the_bounds_no_link_is_named_on_little_evidence() -> None:
    assert slowest_link([_lw("b", 1.0), _lw("c", 1.0), _lw("d", 3.9)]) is None  # under 4x its peers'
    assert slowest_link([_lw("b", 1.0), _lw("c", 1.0), _lw("d", 4.1)]).peer == "d"  # type: ignore[union-attr]
    assert slowest_link([_lw("b", 0.02), _lw("d", 0.5)]) is None  # apart, but a loopback's RTT
    assert slowest_link([_lw("d", 30.0)]) is None  # one connection, no retransmission: nothing to compare
    assert slowest_link([_lw("d", 30.0, retrans=2)]).peer == "d"  # type: ignore[union-attr]
    assert slowest_link([]) is None


def test_the_windows_retransmitted_share_is_of_the_bytes_sent_and_needs_enough_of_them() -> None:
    from perftracker.agent.samplers.tcp_info import MIN_SENT_BYTES, retrans_share

    a = LinkWindow("a:1", "b:1", 3, 1.0, 5, 0.10, MIN_SENT_BYTES, 1e9, 0)
    b = LinkWindow("a:1", "c:1", 3, 1.0, 0, 0.0, 3 * MIN_SENT_BYTES, 1e9, 0)
    assert retrans_share([a, b]) == pytest.approx(0.025)  # 10% of a quarter of the bytes
    short = LinkWindow("a:1", "b:1", 3, 1.0, 5, 0.5, MIN_SENT_BYTES - 1, 1e9, 0)
    assert retrans_share([short]) is None and retrans_share([]) is None
