"""The per-connection TCP sampler on real sockets of this process (issue 44;
agent/samplers/tcp_info.py): ``ss`` run as the sampler runs it, the process's own loopback
connections found by its pid, the bytes a stalled reader leaves queued read from the kernel."""

from __future__ import annotations

import os
import shutil
import socket
import time

import pytest
from perftracker.agent.samplers.tcp_info import read_connections, window_links

pytestmark = pytest.mark.skipif(shutil.which("ss") is None, reason="iproute2's ss is not installed")


def test_a_stalled_readers_connection_shows_its_queue_and_an_idle_one_does_not() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    with srv:
        busy = socket.create_connection(srv.getsockname())
        busy_peer, _ = srv.accept()
        idle = socket.create_connection(srv.getsockname())
        idle_peer, _ = srv.accept()
        try:
            busy.setblocking(False)
            sent = 0
            try:
                for _ in range(4096):
                    sent += busy.send(b"x" * 65536)
            except BlockingIOError:
                pass  # the reader never reads: the buffers are full
            time.sleep(0.05)
            readings = [read_connections({os.getpid()}) for _ in range(2)]
            mine = {c.local: c for c in readings[-1]}
            b = mine[f"127.0.0.1:{busy.getsockname()[1]}"]
            i = mine[f"127.0.0.1:{idle.getsockname()[1]}"]
            assert os.getpid() in b.pids and b.peer == f"127.0.0.1:{srv.getsockname()[1]}"
            assert b.send_q > 0 and b.bytes_sent is not None and 0 < b.bytes_sent <= sent
            assert i.send_q == 0 and not i.bytes_sent  # nothing sent on the idle one
            assert b.rtt_ms is not None and b.rtt_ms >= 0.0
            links = {x.local: x for x in window_links(readings)}
            assert links[b.local].send_q_max == max(c.send_q for r in readings for c in r if c.local == b.local)
            # another process's view: none of them
            assert read_connections({1 << 30}) == []
        finally:
            for s in (busy, busy_peer, idle, idle_peer):
                s.close()


def test_a_missing_ss_is_no_connections_not_an_error() -> None:
    assert read_connections({os.getpid()}, args=("/nonexistent/ss", "-tinpH")) == []
    assert read_connections({os.getpid()}, args=("ss", "--no-such-option")) == []


def test_the_sampler_reports_its_own_connections_retransmitted_share_over_a_window() -> None:
    import threading

    from perftracker.agent.samplers import SamplerOptions, build_samplers, run_samplers
    from perftracker.agent.samplers.base import WindowBounds

    from perftracker.model.raw_window import TCP_RETRANS

    srv = socket.create_server(("127.0.0.1", 0))
    with srv:
        out = socket.create_connection(srv.getsockname())
        peer, _ = srv.accept()
        stop = threading.Event()

        def drain() -> None:
            try:
                while not stop.is_set() and peer.recv(1 << 16):
                    pass
            except OSError:
                pass  # closed at the end of the test

        def pump() -> None:
            try:
                while not stop.is_set():
                    out.sendall(b"x" * (1 << 16))
            except OSError:
                pass

        threads = [threading.Thread(target=f, daemon=True) for f in (drain, pump)]
        for t in threads:
            t.start()
        try:
            samplers = build_samplers(os.getpid(), 0, SamplerOptions(samplers=("procfs", "tcp_info"), gpu_index=-1))
            assert [s.name for s in samplers][-1] == "tcp_info"
            now = time.monotonic_ns()
            got = run_samplers(samplers, WindowBounds(now, now + 1_200_000_000)).series
        finally:
            stop.set()
            out.shutdown(socket.SHUT_RDWR)
            for t in threads:
                t.join(timeout=5)
            out.close()
            peer.close()
    s = got[TCP_RETRANS]
    assert s.source == "tcp_info" and s.value.shape == (1,)  # the process's own, not the namespace's
    assert 0.0 <= float(s.value[0]) < 0.01 and s.period_ns >= 1_000_000_000  # loopback retransmits nothing
