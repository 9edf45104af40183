"""Slow-client soak: idle sockets, slowloris headers and trickled bodies against a real localizer
while a well-behaved agent keeps registering, heartbeating and checking health. Stops by itself
after ``PERFTRACKER_SOAK_S`` seconds (default 8; set e.g. 300 for a long soak).

The well-behaved client (the agent's, with its usual retries) must never fail, its requests stay
fast (p99 under 2 s, a bound measured on a live host: hence the accuracy tier), and the
localizer's open file descriptors stay under its connection cap plus its reserve the whole time."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import psutil
from perftracker.agent.daemon.localizer_client import Uplink
from service_helpers import TOKEN, LocalizerProcess, workers

SOAK_S = float(os.environ.get("PERFTRACKER_SOAK_S", "8"))
CAP = 128
RESERVE = 64


def _attacker(port: int, stop: threading.Event, mode: str, counts: dict[str, int]) -> None:
    held: list[socket.socket] = []
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            counts["connect_failed"] += 1
            time.sleep(0.05)
            continue
        counts[mode] += 1
        try:
            if mode == "slowloris":
                s.sendall(b"GET /v1/healthz HTTP/1.1\r\nHost: x\r\nX-a: ")
            elif mode == "slow_body":
                s.sendall(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                          + b"\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n{")
        except OSError:
            pass
        held.append(s)
        for h in list(held):  # trickle one byte into each held socket; drop the ones the server closed
            try:
                if mode != "idle":
                    h.sendall(b"a")
            except OSError:
                held.remove(h)
                h.close()
        if len(held) > 150:
            held.pop(0).close()
        time.sleep(0.01)
    for h in held:
        h.close()


def test_slow_clients_soak(tmp_path: Path) -> None:
    loc = LocalizerProcess(tmp_path, tmp_path / "s.sqlite",
                           extra=["--header-timeout-s", "1", "--body-timeout-s", "2", "--max-connections", str(CAP)])
    loc.start()
    proc = psutil.Process(loc.proc.pid)  # type: ignore[union-attr]
    stop = threading.Event()
    counts = {"idle": 0, "slowloris": 0, "slow_body": 0, "connect_failed": 0}
    threads = [threading.Thread(target=_attacker, args=(loc.port, stop, mode, counts), daemon=True)
               for mode in ("idle", "slowloris", "slow_body")]
    latencies: list[float] = []
    failures: list[str] = []
    max_fds = 0
    try:
        up = Uplink(loc.url, TOKEN, timeout_s=10)  # an agent's client: it retries resets with backoff
        up.register("soak", "agent-soak", "n", workers([0], 1))
        for t in threads:
            t.start()
        end = time.monotonic() + SOAK_S
        i = 0
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                up.healthz()
                up.heartbeat("soak", "agent-soak", [{"rank": 0, "iteration": i, "phase": "watching"}])
            except Exception as exc:  # noqa: BLE001 - counted: the property is that none happen
                failures.append(repr(exc))
            latencies.append(time.monotonic() - t0)
            max_fds = max(max_fds, proc.num_fds())
            i += 1
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        loc.stop()
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    print(f"\nsoak {SOAK_S:.0f} s: {len(latencies)} good rounds, p99 {p99 * 1000:.0f} ms, max fds {max_fds}, "
          f"attackers {counts}")
    assert not failures, failures[:5]
    assert counts["idle"] > CAP and counts["slowloris"] > 10 and counts["slow_body"] > 10  # the attack happened
    assert p99 < 2.0
    assert max_fds <= CAP + RESERVE
