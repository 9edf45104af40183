"""A slow link found from the kernel's per-connection evidence (issue 44): two network namespaces
this test creates and removes, joined by a veth pair whose client end a tc token bucket limits to 2 Mbit/s; one
process in the client namespace holds a connection over that link and one over its own loopback,
and sends on both. The sampler (``ss`` in that namespace, as the node agent's sampler runs beside
the workers) reads both connections, and ``slowest_link`` names the one over the slowed veth by
its RTT (the queue in front of the limited link). Needs root and iproute2 (skipped otherwise)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from perftracker.agent.samplers.tcp_info import (
    SS_ARGS,
    read_connections,
    slowest_link,
    window_links,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None
                                or shutil.which("ss") is None, reason="needs root, ip, tc and ss")

CLIENT = r"""
import socket, sys, threading, time
slow_addr = (sys.argv[1], int(sys.argv[2]))
lo = socket.create_server(("127.0.0.1", 0))
def drain(s):
    while s.recv(65536):
        pass
def serve():
    c, _ = lo.accept()
    drain(c)
threading.Thread(target=serve, daemon=True).start()
slow = socket.create_connection(slow_addr)
fast = socket.create_connection(lo.getsockname())
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    slow.sendall(b"x" * 4096)
    fast.sendall(b"x" * 4096)
    time.sleep(0.005)
"""

SERVER = r"""
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
c, _ = s.accept()
while c.recv(65536):
    pass
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def test_the_connection_over_a_rate_limited_link_is_named() -> None:
    a, b = f"pt44a{os.getpid()}", f"pt44b{os.getpid()}"
    procs: list[subprocess.Popen[str]] = []
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("link", "add", "v44a", "netns", a, "type", "veth", "peer", "name", "v44b", "netns", b)
        _ip("-n", a, "addr", "add", "10.244.44.1/24", "dev", "v44a")
        _ip("-n", b, "addr", "add", "10.244.44.2/24", "dev", "v44b")
        for ns, dev in ((a, "v44a"), (b, "v44b")):
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        # the client's egress limited to 2 Mbit/s (tbf; this host's kernel has no netem): what it sends
        # faster queues in front of the link, and its RTT grows by the queue's delay
        subprocess.run(["ip", "netns", "exec", b, "tc", "qdisc", "add", "dev", "v44b", "root", "tbf", "rate", "2mbit",
                        "burst", "16kbit", "latency", "400ms"], check=True, capture_output=True, timeout=10)
        server = subprocess.Popen(["ip", "netns", "exec", a, sys.executable, "-c", SERVER, "10.244.44.1", "29544"],
                                  stdout=subprocess.PIPE, text=True)
        procs.append(server)
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        client = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", CLIENT, "10.244.44.1", "29544", "3"],
                                  stdout=subprocess.PIPE, text=True)
        procs.append(client)
        assert client.stdout is not None and client.stdout.readline().strip() == "ready"
        args = ("ip", "netns", "exec", b, *SS_ARGS)
        readings = []
        t0 = time.monotonic()
        for _ in range(5):
            time.sleep(0.3)
            readings.append(read_connections({client.pid}, args=args))
        cost_s = (time.monotonic() - t0 - 1.5) / 5
        links = window_links(readings)
        assert len(links) >= 2, readings
        slow = slowest_link(links)
        assert slow is not None and slow.peer == "10.244.44.1:29544"
        assert slow.rtt_ms >= 20.0 and slow.sent_bytes > 0
        assert all(x.rtt_ms < 5.0 for x in links if x is not slow)
        assert cost_s < 1.0  # one reading (ip netns exec + ss) is far below a window's length
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
