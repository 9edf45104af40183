"""Emulated hosts: one network namespace per worker, joined by veth pairs to a bridge.

Layout for a harness instance with tag T (a short unique id) and N hosts:

    root namespace:  bridge  ptbrT        10.231.K.254/24   (the localizer listens here)
    host i:          netns   ptT-h<i>     veth ptT-v<i> (root side, on the bridge)
                                          veth ptT-p<i> -> renamed eth0 inside, 10.231.K.<i+1>/24

K is derived from the tag, so that two harnesses on one machine use disjoint subnets.

All names carry the tag, so ``cleanup`` removes exactly what this instance made, and
``cleanup_stale`` removes leftovers of earlier instances that died hard. Only addresses inside
these namespaces and the bridge are ever used.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass

from bench.faultkit.inject import CGROUP_V1_CPU, CGROUP_V1_MEMORY, CGROUP_V2, remove_cgroup

log = logging.getLogger(__name__)

PREFIX = "pt"


def subnet_for(tag: str) -> str:
    return f"10.231.{int(tag, 16) % 250 + 1}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def namespaces_available() -> tuple[bool, str]:
    """Whether this machine lets us create network namespaces, veth pairs and a bridge."""
    if os.geteuid() != 0:
        return False, "not root"
    if shutil.which("ip") is None:
        return False, "iproute2 'ip' not found"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
        _ip("link", "add", probe, "type", "bridge")
        _ip("link", "del", probe)
    except subprocess.CalledProcessError as exc:
        return False, (exc.stderr or str(exc)).strip()
    return True, ""


@dataclass
class Host:
    """One emulated host; ``bridge_ip`` is the root namespace's address on the same bridge."""

    index: int
    netns: str
    veth_root: str
    addr: str
    bridge_ip: str

    def wrap(self, argv: list[str], keep_sysfs: bool = False) -> list[str]:
        """argv to run a command inside this host. ``keep_sysfs``: enter only the network namespace
        (nsenter), keeping the node's /sys: ``ip netns exec`` remounts /sys for the namespace, which
        hides /sys/fs/cgroup, and a node agent reads its workers' memory cgroups there (OOM kills)."""
        if keep_sysfs and shutil.which("nsenter"):
            return ["nsenter", f"--net=/var/run/netns/{self.netns}", *argv]
        return ["ip", "netns", "exec", self.netns, *argv]


class EmulatedHosts:
    """A context manager that builds N hosts and always tears them down."""

    def __init__(self, n: int, tag: str | None = None) -> None:
        self.n = n
        # the tag is the owner's pid in hex, so cleanup_stale can tell a dead owner from a live one
        self.tag = tag or format(os.getpid(), "x")
        self.bridge = f"{PREFIX}br{self.tag}"
        self.subnet = subnet_for(self.tag)
        self.bridge_ip = f"{self.subnet}.254"
        self.hosts: list[Host] = []

    def __enter__(self) -> EmulatedHosts:
        try:
            self._build()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.n):
            ns = f"{PREFIX}{self.tag}-h{i}"
            vr, vp = f"{PREFIX}{self.tag}v{i}", f"{PREFIX}{self.tag}p{i}"
            addr = f"{self.subnet}.{i + 1}"
            _ip("netns", "add", ns)
            self.hosts.append(Host(i, ns, vr, addr, self.bridge_ip))
            _ip("link", "add", vr, "type", "veth", "peer", "name", vp)
            _ip("link", "set", vr, "master", self.bridge)
            _ip("link", "set", vr, "up")
            _ip("link", "set", vp, "netns", ns)
            _ip("-n", ns, "link", "set", vp, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        log.info("built %d emulated hosts on bridge %s (%s.0/24)", self.n, self.bridge, self.subnet)

    def cleanup(self) -> None:
        for h in self.hosts:
            _ip("link", "del", h.veth_root, check=False)
            _ip("netns", "del", h.netns, check=False)
        self.hosts.clear()
        _ip("link", "del", self.bridge, check=False)


def _owner_dead(tag: str) -> bool:
    try:
        pid = int(tag, 16)
    except ValueError:
        return False
    return pid != os.getpid() and not os.path.exists(f"/proc/{pid}")


CGROUP_PREFIX = "perftracker-fault-"


def cleanup_stale() -> list[str]:
    """Remove namespaces and bridges named like ours whose owning harness process is gone, and
    the harness's empty CPU-quota cgroups."""
    removed = []
    out = _ip("netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX) and "-h" in name and _owner_dead(name[len(PREFIX):].split("-h")[0]):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    out = _ip("-o", "link", "show", "type", "bridge", check=False).stdout
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(f"{PREFIX}br") and _owner_dead(name[len(PREFIX) + 2:]):
                _ip("link", "del", name, check=False)
                removed.append(name)
    removed += cleanup_stale_cgroups()
    return removed


def cleanup_stale_cgroups() -> list[str]:
    """Remove the harness's CPU-quota and memory cgroups (``perftracker-fault-*``) that no process uses any more:
    an empty one belongs to no running scenario (a running one holds its ranks)."""
    removed = []
    for root in (CGROUP_V1_CPU, CGROUP_V1_MEMORY, CGROUP_V2):
        try:
            candidates = sorted(root.glob(f"{CGROUP_PREFIX}*"))
        except OSError:
            continue
        for path in candidates:
            try:
                busy = bool((path / "cgroup.procs").read_text().split())
            except OSError:
                continue
            if not busy and remove_cgroup(path, attempts=1):
                removed.append(path.name)
    return removed
