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
