"""One localizer per job across nodes, found through the job's own rendezvous store (issue 42).

Every multi-node PyTorch job has a store that all its ranks reach: the c10d store of
``init_process_group`` (torchrun, ``srun``, the Kubernetes operators alike). perftracker uses it,
and nothing else, so that a job of many nodes gets one report with no configuration:

1. Global rank 0 asks its node agent to serve the job on the address this node uses to reach its
   peers (``bind_address``), with a fresh job token (``JOB_SERVE`` -> ``JOB_SERVED``), and
   publishes ``{url, token, served_by}`` in the store under ``STORE_KEY``.
2. Local rank 0 of every node reads it there (every 0.5 s, backing off, until it is there) and
   tells its own node agent (``JOB_ROUTE``); an agent on
   another node then sends that job's registrations, triggers and uploads to that URL; the agent
   of rank 0's node ignores it (it is its own localizer).
3. Rank 0 re-serves when it reconnects to a new agent (its old one died), and publishes the new
   URL; the local rank 0s re-read the store every ``RECHECK_S`` and follow it (one store read per
   node every 5 s: 200 reads a second for a job of 1,000 nodes).

Nothing happens when the job runs on one node (``LOCAL_WORLD_SIZE == WORLD_SIZE``, ``SLURM_NNODES=1``,
or a loopback route to the master), when ``PERFTRACKER_LOCALIZER_URL`` names a shared localizer
(it wins), or when the agent does not offer it (an older agent). Runs on the channel thread; never
raises; store calls are short (``check`` before ``get``).
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import logging
import os
import secrets
import socket
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from perftracker.runtime.identity import default_store
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType

log = logging.getLogger(__name__)

STORE_KEY = "perftracker/localizer/v1"
RECHECK_S = 5.0  # how often local rank 0 of each node re-reads the store (a restarted localizer's new URL)
FEATURE = "job_link"  # what an agent's ACK lists when it can serve or route a job (agent/daemon/job_links.py)
PORT_ENV = "PERFTRACKER_LOCALIZER_PORT"  # the port the job's localizer listens on (default: any free one)
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class JobRoute:
    """Where a multi-node job reports: its localizer's URL, the job's token, the serving agent."""

    url: str
    token: str
    served_by: str

    def to_json(self) -> str:
        return json.dumps({"url": self.url, "token": self.token, "served_by": self.served_by})

    @classmethod
    def from_json(cls, text: str) -> JobRoute | None:
        try:
            d = json.loads(text)
            route = cls(str(d["url"]), str(d["token"]), str(d["served_by"]))
        except (ValueError, KeyError, TypeError):
            return None
        ok = route.url.startswith(("http://", "https://")) and 16 <= len(route.token) <= 200
        return route if ok else None


def spans_nodes(env: Mapping[str, str]) -> bool | None:
    """Whether the job runs on more than one node, as far as the launcher's environment says
    (None: it does not say; then the route to the master decides)."""
    try:
        if "LOCAL_WORLD_SIZE" in env and "WORLD_SIZE" in env:
            return int(env["WORLD_SIZE"]) > int(env["LOCAL_WORLD_SIZE"])
        for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
            if name in env:
                return int(env[name]) > 1
    except ValueError:
        return None
    return None


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface ``name``, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def route_source(host: str, port: int = 9) -> str | None:
    """The local address the kernel would use to reach ``host`` (a UDP connect sends nothing)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.connect(addr)
                return str(s.getsockname()[0])
        except OSError:
            continue
    return None


def bind_address(env: Mapping[str, str], master: tuple[str, int] | None = None) -> str | None:
    """The address of this node on the job's own network: the interface ``GLOO_SOCKET_IFNAME`` or
    ``NCCL_SOCKET_IFNAME`` names (the first of a list; an exclusion ``^...`` is skipped), else the
    source of the route to ``MASTER_ADDR`` (or the store's host). None when there is none."""
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = env.get(var, "").strip()
        if value and not value.startswith("^"):
            first = value.split(",")[0].lstrip("=").strip()
            addr = interface_address(first) if first else None
            if addr:
                return addr
    host = env.get("MASTER_ADDR") or (master[0] if master else "")
    port = master[1] if master else 9
    try:
        port = int(env.get("MASTER_PORT", port))
    except ValueError:
        pass
    return route_source(host, port) if host else None


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return True


def store_master(store: Any) -> tuple[str, int] | None:
    """(host, port) of a TCPStore under PrefixStores, or None."""
    for _ in range(8):
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if isinstance(host, str) and isinstance(port, int):
            return host, port
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


class JobLink:
    """The worker's side of one localizer per job (see the module doc). ``messages`` is called on
    the channel thread at each stats tick with the agent's ACK; it returns what to send the agent."""

    def __init__(self, identity: Callable[[], Any], localizer_url: str = "",
                 env: Mapping[str, str] | None = None, store: Callable[[], Any] = default_store,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._identity = identity
        self._shared = bool(localizer_url)
        self._env = os.environ if env is None else env
        self._store = store
        self._clock = clock
        self._token = secrets.token_urlsafe(24)
        self._asked = False  # rank 0: JOB_SERVE sent to the current agent
        self._published: JobRoute | None = None  # rank 0: what the store holds
        self._sent: JobRoute | None = None  # other ranks: what the current agent was told
        self._next_check = 0.0
        self._wait_s = 0.0  # the current wait between store reads while the URL is not published
        self._off = ""  # why this process does nothing (said once at debug level)

    def pending(self) -> bool:
        """Whether this worker will name the job's localizer (told in REGISTER): the job spans nodes
        by the launcher's environment, its master is not on loopback, and no shared localizer is
        configured. Every rank decides it alike, so no agent holds a job that no rank will name."""
        try:
            if self._shared or spans_nodes(self._env) is not True:
                return False
            addr = bind_address(self._env)  # a master on loopback: the "nodes" share one host
            return addr is not None and not is_loopback(addr)
        except Exception:  # noqa: BLE001
            return False

    def agent_changed(self) -> None:
        """A new connection (maybe a new agent): serve or route again."""
        self._asked = False
        self._sent = None
        self._next_check = 0.0
        self._wait_s = 0.0

    def messages(self, ack: Mapping[str, Any]) -> list[dict[str, Any]]:
        """What to send the agent now (usually nothing). Never raises."""
        try:
            return self._messages(ack)
        except Exception as exc:  # noqa: BLE001 - never break the channel
            log.debug("perftracker: job link step failed: %r", exc)
            return []

    def _messages(self, ack: Mapping[str, Any]) -> list[dict[str, Any]]:
        if self._off or self._shared:
            return []
        features = ack.get("features")
        if not isinstance(features, list) or FEATURE not in features:
            return []
        ident = self._identity()
        if not getattr(ident, "settled", False) or getattr(ident, "source", "") != "process group":
            return []
        if int(ident.world_size) <= 1 or spans_nodes(self._env) is False:
            self._off = "one node"
            return []
        store = self._store()
        if store is None:
            return []
        if int(ident.rank) == 0:
            return self._serve(ident, store)
        if int(getattr(ident, "local_rank", 0)) != 0:
            return []  # one rank per node tells its agent: the store is read once per node, not per rank
        return self._follow(ident, store)

    def _serve(self, ident: Any, store: Any) -> list[dict[str, Any]]:
        if self._asked:
            return []
        host = bind_address(self._env, store_master(store))
        if host is None or is_loopback(host):
            self._off = f"the route to the master is local ({host})"
            return []
        try:
            port = int(self._env.get(PORT_ENV, "0") or 0)
        except ValueError:
            log.warning("perftracker: ignoring %s=%r (not a port number)", PORT_ENV, self._env.get(PORT_ENV))
            port = 0
        self._asked = True
        return [wire.make_message(MessageType.JOB_SERVE, job=str(ident.job), host=host, port=port,
                                  token=self._token)]

    def on_served(self, msg: Mapping[str, Any]) -> None:
        """Rank 0: the agent's answer to JOB_SERVE; publish the URL in the store."""
        if msg.get("error") or not msg.get("url"):
            log.warning("perftracker: this job spans nodes but its localizer cannot serve the other nodes: %s; "
                        "each node reports its own ranks", msg.get("error") or "no URL")
            return
        route = JobRoute(str(msg["url"]), self._token, str(msg.get("agent_id") or ""))
        store = self._store()
        if store is None:
            return
        try:
            store.set(STORE_KEY, route.to_json())
        except Exception as exc:  # noqa: BLE001 - a store that went away
            log.warning("perftracker: could not publish the job's localizer in the rendezvous store: %r", exc)
            self._asked = False
            return
        if self._published != route:
            log.warning("perftracker: this job spans nodes: its one localizer runs on this node at %s; every node "
                        "reports there (`perftracker report latest` on this node, or on any node of the job)",
                        route.url)
        self._published = route

    def _follow(self, ident: Any, store: Any) -> list[dict[str, Any]]:
        now = self._clock()
        if now < self._next_check:
            return []
        if self._sent is None:  # not found yet: 0.5 s, then 1.5 times longer each time, up to RECHECK_S
            self._wait_s = min(RECHECK_S, self._wait_s * 1.5) if self._wait_s else 0.5
            self._next_check = now + self._wait_s
        else:
            self._next_check = now + RECHECK_S
        try:
            if not store.check([STORE_KEY]):
                return []
            route = JobRoute.from_json(bytes(store.get(STORE_KEY)).decode("utf-8", "replace"))
        except Exception as exc:  # noqa: BLE001
            log.debug("perftracker: store read of %s failed: %r", STORE_KEY, exc)
            return []
        if route is None or route == self._sent:
            return []
        if self._sent is None and int(getattr(ident, "local_rank", 0)) == 0:
            log.info("perftracker: this node's ranks report to the job's localizer at %s", route.url)
        self._sent = route
        return [wire.make_message(MessageType.JOB_ROUTE, job=str(ident.job), url=route.url, token=route.token,
                                  served_by=route.served_by)]
