"""Slow and idle clients: a header read timeout and a connection cap in front of aiohttp.

aiohttp has no timeout for the first request's headers (a client that connects and sends half a
header line is kept for ever) and no cap on connections (idle sockets run the process out of file
descriptors, and then nothing is accepted, ``/v1/healthz`` included). ``ConnectionGuard`` wraps
aiohttp's protocol factory:

- a connection must complete its request headers within ``header_timeout_s`` of connecting, else it
  is closed (aiohttp's own ``keepalive_timeout`` bounds the wait for the next request's headers,
  and ``localizer.http_io.read_body`` bounds the body);
- at most ``max_connections`` are open. At the cap, a new connection evicts the oldest one that has
  not yet sent its headers (the idle kind an attacker opens); if every connection is busy with a
  request, the new one is closed instead. Either way the service keeps answering its clients.

``GuardedSite`` is an aiohttp ``TCPSite`` that listens through the guard.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
from collections import OrderedDict
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

FD_RESERVE = 64  # descriptors kept for the store, report files, the Kubernetes client, logging


def default_max_connections() -> int:
    """The soft RLIMIT_NOFILE minus a reserve (at least 32)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(32, int(soft) - FD_RESERVE)


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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.guard.admit(self):
            transport.abort()
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
        self.max_connections = max_connections or default_max_connections()
        self.open: OrderedDict[int, _Guarded] = OrderedDict()
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0
        self._warned = False

    def __call__(self) -> _Guarded:
        return _Guarded(self, self.factory())

    def admit(self, conn: _Guarded) -> bool:
        if len(self.open) >= self.max_connections:
            victim = next((c for c in self.open.values() if c.waiting), None)
            if victim is None:
                self.refused += 1
                self._warn()
                return False
            self.evicted += 1
            self._warn()
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
            log.warning("%d connections open (the cap): closing idle ones without a request first", self.max_connections)


class GuardedSite(web.TCPSite):
    """A TCPSite whose connections go through a ConnectionGuard."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, guard_options: dict[str, Any],
                 ssl_context: ssl.SSLContext | None = None, backlog: int = 4096) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context, backlog=backlog, reuse_address=True)
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
