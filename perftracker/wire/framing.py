"""The worker <-> node agent wire: length-prefixed JSON frames over a Unix socket.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of UTF-8 JSON. The JSON
is one object with a ``type`` field (one of ``MessageType``) and the fields that type requires
(``REQUIRED_FIELDS``). Nothing is ever pickled: a frame that is not a JSON object, is larger than
``MAX_FRAME_BYTES`` or lacks a required field raises ``WireError``.

Workers send REGISTER first, then HEARTBEAT, ITER_STATS, TRIGGER, BLOCKED, HANG_SNAPSHOT and
WINDOW_DONE. The agent answers REGISTER with ACK and sends START_WINDOW (and SNAPSHOT, a request for
a hang snapshot) when a session opens, and NOTICE when something on its side means that no report
will come (the worker logs it once, on local rank 0).

The socket lives at ``<run_dir>/agent.sock`` (``socket_path``). Both blocking helpers
(``send_message``/``recv_message`` for the worker's channel thread) and asyncio helpers
(``read_message``/``write_message`` for the agent) are here; this module imports only the standard
library, so it is safe inside the training process.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import struct
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any

from perftracker.errors import TransportError

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 4 * 1024 * 1024  # a hang snapshot with a deep stack is the largest message
SOCKET_NAME = "agent.sock"
_HEADER = struct.Struct(">I")


class WireError(TransportError):
    """A frame on the worker <-> agent socket is malformed, too large or of an unknown type."""


class BadFrameBody(WireError):
    """A whole frame was read but its body is not JSON (or nests too deeply to parse): the stream
    is still in step, so a reader may drop this message and go on (issue 46: a frame nested
    100,000 levels deep dropped the worker's connection)."""


class ConnectionClosed(TransportError):
    """The peer closed the socket (cleanly or in the middle of a frame)."""


class MessageType(StrEnum):
    # worker -> agent
    REGISTER = "register"
    HEARTBEAT = "heartbeat"
    ITER_STATS = "iter_stats"
    TRIGGER = "trigger"
    BLOCKED = "blocked"
    HANG_SNAPSHOT = "hang_snapshot"
    WINDOW_DONE = "window_done"
    JOB_SERVE = "job_serve"  # global rank 0: serve this job's localizer to the other nodes (issue 42)
    JOB_ROUTE = "job_route"  # a rank on another node: the job's localizer is at this URL (issue 42)
    # agent -> worker
    ACK = "ack"
    START_WINDOW = "start_window"
    SNAPSHOT = "snapshot"
    NOTICE = "notice"  # an agent-side failure that means no report will come (logged once by the worker)
    JOB_SERVED = "job_served"  # the answer to JOB_SERVE: the URL the other nodes reach, or why not
    REPORT_READY = "report_ready"  # a report of this job is stored: where to find it (logged by global rank 0)


# field -> accepted types; ints are also accepted where floats are expected
REQUIRED_FIELDS: dict[MessageType, dict[str, tuple[type, ...]]] = {
    MessageType.REGISTER: {
        "protocol": (int,), "job": (str,), "rank": (int,), "world_size": (int,), "local_rank": (int,),
        "pid": (int,), "training_tid": (int,), "host": (str,),
    },
    MessageType.HEARTBEAT: {"iteration": (int,), "phase": (str,)},
    MessageType.ITER_STATS: {"iteration": (int,), "recent_ms": (list,)},
    MessageType.TRIGGER: {"reason": (str,), "detail": (dict,)},
    MessageType.BLOCKED: {"detail": (dict,)},
    MessageType.HANG_SNAPSHOT: {"snapshot": (dict,)},
    MessageType.WINDOW_DONE: {"session": (str,), "raw_path": (str,), "start_ns": (int,), "end_ns": (int,), "error": (str,)},
    MessageType.ACK: {"ok": (bool,)},
    MessageType.START_WINDOW: {"session": (str,), "window_s": (float, int)},
    MessageType.SNAPSHOT: {"session": (str,)},
    MessageType.NOTICE: {"key": (str,), "text": (str,)},
    MessageType.JOB_SERVE: {"job": (str,), "host": (str,), "port": (int,), "token": (str,)},
    MessageType.JOB_ROUTE: {"job": (str,), "url": (str,), "token": (str,), "served_by": (str,)},
    MessageType.JOB_SERVED: {"job": (str,), "url": (str,), "agent_id": (str,), "error": (str,)},
    MessageType.REPORT_READY: {"job": (str,), "session": (str,), "text": (str,)},
}


def socket_path(run_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(run_dir), SOCKET_NAME)


def make_message(kind: MessageType, **fields: Any) -> dict[str, Any]:
    """A message dict of the given type; validated, so a caller's mistake fails at the sender."""
    msg = {"type": kind.value, **fields}
    validate(msg)
    return msg


def validate(msg: Any) -> MessageType:
    """Check a decoded message and return its type; WireError names the bad field."""
    if not isinstance(msg, dict):
        raise WireError(f"message: expected a JSON object, got {type(msg).__name__}")
    raw_type = msg.get("type")
    try:
        if not isinstance(raw_type, str):
            raise ValueError(raw_type)
        kind = MessageType(raw_type)
    except ValueError:
        raise WireError(f"message: unknown type {raw_type!r}") from None
    for name, types in REQUIRED_FIELDS[kind].items():
        if name not in msg:
            raise WireError(f"{kind.value}: missing field {name!r}")
        value = msg[name]
        if isinstance(value, bool) and bool not in types:
            raise WireError(f"{kind.value}.{name}: expected {types[0].__name__}, got a bool")
        if not isinstance(value, types):
            raise WireError(f"{kind.value}.{name}: expected {types[0].__name__}, got {value!r:.60}")
        if isinstance(value, float) and not math.isfinite(value):
            raise WireError(f"{kind.value}.{name}: not a finite number")
    return kind


def encode(msg: Mapping[str, Any]) -> bytes:
    """One frame: length header + compact JSON. Raises WireError if it would exceed MAX_FRAME_BYTES."""
    try:
        body = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise WireError(f"message is not JSON-serializable: {exc}") from None
    if len(body) > MAX_FRAME_BYTES:
        raise WireError(f"message of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadFrameBody(f"frame is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadFrameBody("frame is not valid JSON: nested too deeply") from None
    validate(msg)
    return msg


def _check_length(length: int) -> None:
    if length > MAX_FRAME_BYTES:
        raise WireError(f"frame of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, iterate over complete messages."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        self._buf.extend(data)
        while len(self._buf) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buf)
            _check_length(length)
            end = _HEADER.size + length
            if len(self._buf) < end:
                return
            body = bytes(self._buf[_HEADER.size:end])
            del self._buf[:end]
            yield decode_body(body)

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)


# -------------------------------------------------------------------------------------------
# blocking helpers (worker channel thread)
# -------------------------------------------------------------------------------------------


def send_message(sock: socket.socket, msg: Mapping[str, Any]) -> None:
    try:
        sock.sendall(encode(msg))
    except OSError as exc:
        raise ConnectionClosed(f"send failed: {exc}") from None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        try:
            chunk = sock.recv(min(n, 1 << 20))
        except OSError as exc:
            raise ConnectionClosed(f"receive failed: {exc}") from None
        if not chunk:
            raise ConnectionClosed("peer closed the socket")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_message(sock: socket.socket) -> dict[str, Any]:
    """Read exactly one frame (blocking, honouring the socket's timeout)."""
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    _check_length(length)
    return decode_body(_recv_exact(sock, length))


def connect(path: str, timeout_s: float = 2.0) -> socket.socket:
    """A connected Unix socket to the agent, or TransportError (also when the socket or its directory
    belongs to another user: perftracker.rundir.check_agent_socket)."""
    from perftracker.rundir import check_agent_socket

    check_agent_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise TransportError(f"cannot connect to the agent at {path}: {exc}") from None
    return sock


# -------------------------------------------------------------------------------------------
# asyncio helpers (agent)
# -------------------------------------------------------------------------------------------


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    """One message; ConnectionClosed at end of stream, WireError on a bad frame."""
    try:
        header = await reader.readexactly(_HEADER.size)
        (length,) = _HEADER.unpack(header)
        _check_length(length)
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ConnectionClosed("peer closed the socket") from None
    except (ConnectionError, OSError) as exc:
        raise ConnectionClosed(f"receive failed: {exc}") from None
    return decode_body(body)


async def write_message(writer: asyncio.StreamWriter, msg: Mapping[str, Any]) -> None:
    try:
        writer.write(encode(msg))
        await writer.drain()
    except (ConnectionError, OSError) as exc:
        raise ConnectionClosed(f"send failed: {exc}") from None
