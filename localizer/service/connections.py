"""Slow and idle clients: a header read timeout and a connection cap in front of aiohttp.

aiohttp has no timeout for the first request's headers (a client that connects and sends half a
header line is kept for ever) and no cap on connections (idle sockets run the process out of file
descriptors, and then nothing is accepted, ``/v1/healthz`` included). ``ConnectionGuard`` wraps
aiohttp's protocol factory:

- a connection must complete its request headers within ``header_timeout_s`` of connecting, else it
  is closed (aiohttp's own ``keepalive_timeout`` bounds the wait for the next request's headers,
  and ``perftracker.localizer.service.http_io.read_body`` bounds the body);
- at most ``max_connections`` are open (default: the descriptor limit minus a reserve and
  ``ACCEPT_BATCHES_IN_FLIGHT`` accept batches; the listen backlog, which asyncio also uses as its
  accept batch, is sized to fit). At the cap, a new connection evicts the oldest one that has
  not yet sent its headers (the idle kind an attacker opens), or else the oldest of all (a trickled
  body, a long poll, whose client retries), sparing connections younger than ``EVICT_GRACE_S`` (a
  burst must not evict a client before it could send its request); only when every slot is that
  young is the newcomer turned away. However the slots are held, clients keep getting in.

``GuardedSite`` is an aiohttp ``TCPSite`` that listens through the guard.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
import time
from collections import OrderedDict
from typing import Any, cast

from aiohttp import web

log = logging.getLogger(__name__)

EVICT_GRACE_S = 0.25  # a connection this young is not evicted for a newcomer
FD_RESERVE = 64  # descriptors kept for the store, report files, the Kubernetes client, logging
# Descriptors above the cap while a burst arrives at a full cap: asyncio accepts a batch in one loop
# pass and creates the transports (which reach the guard) a pass later, and an evicted socket is
# closed a pass after its abort(), while the listener keeps accepting a batch per pass. Up to three
# batches are open above the cap (a fast client filling 1,100 sockets under ulimit -n 1024 hit EMFILE
# with room for one); four leave a margin.
ACCEPT_BATCHES_IN_FLIGHT = 4


def _soft_nofile() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 65536 if soft == resource.RLIM_INFINITY else int(soft)


def accept_batch(soft_nofile: int | None = None) -> int:
    """The listen backlog, which is also how many sockets asyncio accepts in one go, before any
    of them reaches the guard: it must fit in the descriptors left above the cap (else EMFILE,
    and asyncio stops accepting for a second, /v1/healthz included)."""
    soft = soft_nofile or _soft_nofile()
    return min(4096, max(16, soft // 32))


def default_max_connections(soft_nofile: int | None = None) -> int:
    """The soft RLIMIT_NOFILE minus a reserve and the accept batches in flight (at least 32)."""
    soft = soft_nofile or _soft_nofile()
    return max(32, soft - FD_RESERVE - ACCEPT_BATCHES_IN_FLIGHT * accept_batch(soft))


def raise_fd_limit(want: int = 65536) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard one (at most ``want``); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return int(soft)


class _Guarded(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's handler, watches for the end of headers."""

    def __init__(self, guard: ConnectionGuard, inner: Any) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.waiting = True  # no complete request head yet
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None
        self._inner_connected = False
        self.since = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream server's connection: a whole Transport (asyncio's or uvloop's), not a BaseTransport
        self.transport = whole = cast(asyncio.Transport, transport)
        if not self.guard.admit(self):
            whole.abort()
            return
        self._timer = asyncio.get_running_loop().call_later(self.guard.header_timeout_s, self._timeout)
        self._inner_connected = True
        self.inner.connection_made(transport)

    def _timeout(self) -> None:
        if self.waiting and self.transport is not None:
            self.guard.timed_out += 1
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.waiting:
            buf = self._tail + data
            if b"\r\n\r\n" in buf:
                self.waiting = False
                if self._timer is not None:
                    self._timer.cancel()
            else:
                self._tail = buf[-3:]
        if self._inner_connected:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self._inner_connected else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.guard.release(self)
        if self._inner_connected:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class ConnectionGuard:
    """The header timeout and the connection cap, shared by the connections of one listener."""

    def __init__(self, factory: Any, header_timeout_s: float = 10.0, max_connections: int | None = None) -> None:
        self.factory = factory  # aiohttp's web.Server: () -> RequestHandler
        self.header_timeout_s = header_timeout_s
        limit = default_max_connections()
        if max_connections and max_connections > limit:
            log.warning("--max-connections %d is above what the descriptor limit allows; using %d", max_connections,
                        limit)
        self.max_connections = min(max_connections or limit, limit)
        self.open: OrderedDict[int, _Guarded] = OrderedDict()
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0
        self._warned = False

    def __call__(self) -> _Guarded:
        return _Guarded(self, self.factory())

    def admit(self, conn: _Guarded) -> bool:
        if len(self.open) >= self.max_connections:
            # the oldest one still without a request head (the idle kind), else the oldest of all (a
            # trickled body, a long poll: its client retries); never the newcomer, who may be healthy
            # one younger than EVICT_GRACE_S is spared: a burst must not evict a client that has not
            # had the time to send its request; when all are that young, the newcomer is turned away
            now = time.monotonic()
            victim = None
            for c in self.open.values():  # oldest first
                if now - c.since < EVICT_GRACE_S:
                    break
                if c.waiting:
                    victim = c
                    break
            if victim is None:
                oldest = next(iter(self.open.values()))
                victim = oldest if now - oldest.since >= EVICT_GRACE_S else None
            self._warn()
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            self.release(victim)
            if victim.transport is not None:
                victim.transport.abort()
        self.open[id(conn)] = conn
        return True

    def release(self, conn: _Guarded) -> None:
        self.open.pop(id(conn), None)

    def _warn(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning("%d connections open (the cap): closing the oldest (idle ones first) for new ones",
                        self.max_connections)


class GuardedSite(web.TCPSite):
    """A TCPSite whose connections go through a ConnectionGuard."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, guard_options: dict[str, Any],
                 ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context, backlog=accept_batch(), reuse_address=True)
        self._guard_options = guard_options
        self.guard: ConnectionGuard | None = None

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self.guard = ConnectionGuard(server, **self._guard_options)
        self._server = await loop.create_server(self.guard, self._host, self._port, ssl=self._ssl_context,
                                                backlog=self._backlog, reuse_address=self._reuse_address)
