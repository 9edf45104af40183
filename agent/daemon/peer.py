"""Who is at the other end of a worker's Unix socket, as the kernel says (``SO_PEERCRED``; issue 46).

A worker's REGISTER names its pid; the agent starts samplers for that pid and reads the process's
environment and cgroup. The worker's word is not enough: 30 registrations naming one ``sleep``'s pid
started 30 sampler processes, and with ``--socket-group`` a group member could point root-owned
samplers at any pid. The kernel's credentials of the connecting process are taken instead: its pid
(in the agent's pid namespace; 0 when the peer's namespace is not visible from the agent's, then the
declared pid stands, as the kernel gives nothing better) and its uid (whose files the agent may read
for it: ``worker_exits.read_error_file``).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class PeerCred:
    pid: int  # 0: not visible in the agent's pid namespace
    uid: int
    gid: int


def peer_cred(transport_socket: Any) -> PeerCred | None:
    """The kernel's credentials of a connected Unix socket's peer; None off Linux, for another kind
    of socket, or when they cannot be read."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if transport_socket is None or opt is None or getattr(transport_socket, "family", None) != socket.AF_UNIX:
        return None
    try:
        pid, uid, gid = _CRED.unpack(transport_socket.getsockopt(socket.SOL_SOCKET, opt, _CRED.size))
    except (OSError, struct.error):
        return None
    return PeerCred(pid, uid, gid)
