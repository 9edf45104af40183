"""Emulated hosts (network namespaces on a bridge) and the out-of-process injectors, for real."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from bench.faultkit.hosts import EmulatedHosts, namespaces_available
from bench.faultkit.inject import CpuQuota, RateLimit

NETNS, WHY = namespaces_available()


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.skipif(not NETNS, reason=f"network namespaces unavailable: {WHY}")
def test_hosts_reach_each_other_and_are_removed() -> None:
    server = "import socket;s=socket.socket();s.bind(('0.0.0.0',45111));s.listen();c,_=s.accept();c.sendall(b'hi')"
    with EmulatedHosts(2) as hs:
        a, b = hs.hosts
        assert a.addr != b.addr and a.bridge_ip.endswith(".254")
        assert {a.netns, b.netns} <= _netns_names()
        srv = subprocess.Popen(b.wrap([sys.executable, "-c", server]))
        try:
            client = f"import socket,time\nfor _ in range(50):\n try:\n  print(socket.create_connection(('{b.addr}',45111),timeout=1).recv(2).decode());break\n except OSError: time.sleep(0.1)"
            out = subprocess.run(a.wrap([sys.executable, "-c", client]), capture_output=True, text=True, timeout=30)
            assert out.stdout.strip() == "hi"
            with RateLimit(b.veth_root, b.netns, 10):
                qd = subprocess.run(["tc", "qdisc", "show", "dev", b.veth_root], capture_output=True, text=True).stdout
                assert "tbf" in qd and "10Mbit" in qd
            qd = subprocess.run(["tc", "qdisc", "show", "dev", b.veth_root], capture_output=True, text=True).stdout
            assert "tbf" not in qd
        finally:
            srv.kill()
            srv.wait()
        names = {a.netns, b.netns}
    assert not names & _netns_names()


def test_cpu_quota_throttles_and_is_removed() -> None:
    try:
        quota = CpuQuota("perftracker-test-quota", 0.2)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no cgroup cpu controller: {exc}")
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<4: pass"])
    try:
        with quota as q:
            q.add(busy.pid)
            p = psutil.Process(busy.pid)
            p.cpu_percent()
            time.sleep(1.5)
            assert p.cpu_percent() < 40.0  # 20% of one CPU, with scheduling slack
        assert not q.path.exists()
    finally:
        busy.kill()
        busy.wait()


def test_cpu_quota_of_a_killed_rank_is_removed_and_stale_ones_are_cleaned() -> None:
    """A rank killed just before teardown (still exiting) must not leave its cgroup behind, and an
    empty harness cgroup left by a dead harness is removed by cleanup_stale()."""
    from bench.faultkit.hosts import CGROUP_PREFIX, cleanup_stale_cgroups

    try:
        quota = CpuQuota(f"{CGROUP_PREFIX}test-killed", 0.2)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no cgroup cpu controller: {exc}")
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<20: pass"])
    with quota as q:
        q.add(busy.pid)
        busy.kill()  # exiting while the cgroup is torn down
    busy.wait()
    assert not q.path.exists()
    # an empty leftover (a harness that died before its teardown) goes; one in use stays
    stale = q.path.parent / f"{CGROUP_PREFIX}test-stale"
    used = CpuQuota(f"{CGROUP_PREFIX}test-used", 0.5)
    stale.mkdir(exist_ok=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with used as u:
            u.add(sleeper.pid)
            removed = cleanup_stale_cgroups()
            assert stale.name in removed and not stale.exists()
            assert u.path.exists() and u.path.name not in removed
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not used.path.exists()
