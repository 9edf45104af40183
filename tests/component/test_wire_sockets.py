"""The worker <-> agent wire over real sockets: a socketpair round trip, a hostile header and a peer
that closes mid-frame on a live socket, the asyncio server with a blocking client, a missing socket.
The framing and validation without sockets: tests/unit/test_wire.py."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

import pytest

from perftracker.wire import framing as wire
from perftracker.wire.framing import ConnectionClosed, MessageType, WireError


def _register(**over: object) -> dict:
    fields = dict(protocol=1, job="j", rank=3, world_size=4, local_rank=1, pid=123, training_tid=124, host="h")
    fields.update(over)
    return wire.make_message(MessageType.REGISTER, **fields)


def test_roundtrip_over_a_real_socketpair() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        msgs = [
            _register(),
            wire.make_message(MessageType.HEARTBEAT, iteration=7, phase="watching"),
            wire.make_message(MessageType.TRIGGER, reason="slowdown", detail={"ratio": 1.2}),
            wire.make_message(MessageType.START_WINDOW, session="s1", window_s=5.0),
        ]
        for m in msgs:
            wire.send_message(a, m)
        got = [wire.recv_message(b) for _ in msgs]
    assert got == msgs
    assert got[0]["rank"] == 3 and got[3]["window_s"] == 5.0


def test_a_hostile_header_on_a_live_socket_is_refused() -> None:
    # the size limit without a socket: tests/unit/test_wire.py
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", 2**31))
        with pytest.raises(WireError):
            wire.recv_message(b)


def test_peer_close_mid_frame_is_connection_closed() -> None:
    a, b = socket.socketpair()
    frame = wire.encode(_register())
    a.sendall(frame[:7])
    a.close()
    with b, pytest.raises(ConnectionClosed):
        wire.recv_message(b)


def test_asyncio_server_and_blocking_client(tmp_path) -> None:
    path = wire.socket_path(tmp_path)
    received: list[dict] = []
    ready = threading.Event()

    async def serve() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            msg = await wire.read_message(reader)
            received.append(msg)
            await wire.write_message(writer, wire.make_message(MessageType.ACK, ok=True))
            try:
                await wire.read_message(reader)
            except ConnectionClosed:
                received.append({"closed": True})
            writer.close()

        server = await asyncio.start_unix_server(handle, path=path)
        ready.set()
        async with server:
            for _ in range(200):
                if len(received) >= 2:
                    return
                await asyncio.sleep(0.01)

    t = threading.Thread(target=lambda: asyncio.run(serve()))
    t.start()
    assert ready.wait(5)
    sock = wire.connect(path)
    wire.send_message(sock, _register(rank=0))
    assert wire.recv_message(sock) == {"type": "ack", "ok": True}
    sock.close()
    t.join(5)
    assert received[0]["type"] == "register" and received[0]["rank"] == 0
    assert received[1] == {"closed": True}


def test_connect_to_missing_socket_is_transport_error(tmp_path) -> None:
    from perftracker.errors import TransportError

    with pytest.raises(TransportError, match="cannot connect"):
        wire.connect(str(tmp_path / "nope.sock"), timeout_s=0.5)
