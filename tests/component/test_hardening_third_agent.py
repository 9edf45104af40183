"""Issue 46 (third red-team round), items 4 and 8, on a real agent process and real sockets:

4. the worker-named ``TORCHELASTIC_ERROR_FILE``: a FIFO must not freeze the agent, a file of
   another uid (root's, when the suite runs as root) must not be read into the report;
8. the worker's pid and uid come from the kernel (``SO_PEERCRED``). The same on a real agent
   process: tests/system/test_agent_peer_live.py.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from perftracker.agent.daemon.daemon import death_snapshot
from perftracker.agent.daemon.peer import peer_cred
from perftracker.agent.daemon.worker_exits import read_error_file
from perftracker.agent.daemon.workers import Worker

ERROR_JSON = json.dumps({"message": {"message": "RuntimeError: secret of root", "extraInfo": {"timestamp": "1"}}})


def test_peer_cred_is_the_kernels_word() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_cred(b) is not None
        cred = peer_cred(b)
        assert (cred.pid, cred.uid, cred.gid) == (os.getpid(), os.geteuid(), os.getegid())  # type: ignore[union-attr]
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with tcp:
        assert peer_cred(tcp) is None and peer_cred(None) is None


def test_an_error_file_is_read_only_when_it_is_a_regular_file_of_the_workers_uid(tmp_path: Path) -> None:
    good = tmp_path / "error.json"
    good.write_text(ERROR_JSON)
    assert read_error_file(str(good), owner=os.geteuid())[0] == "RuntimeError: secret of root"
    assert read_error_file(str(good), owner=os.geteuid() + 1) == ("", 0)  # not the worker's
    assert read_error_file(str(good), owner=-1) == ("", 0)  # the worker's uid not known
    link = tmp_path / "link.json"
    link.symlink_to(good)
    assert read_error_file(str(link), owner=os.geteuid()) == ("", 0)  # never through a symlink
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out: list[tuple[str, int]] = []
    t = threading.Thread(target=lambda: out.append(read_error_file(str(fifo), owner=os.geteuid())), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive() and out == [("", 0)]  # a FIFO with no writer blocked open() forever
    # the death snapshot takes the message only from the worker's own file
    w = Worker(job="j", rank=0, world_size=1, local_rank=0, pid=1, training_tid=1, host="h", error_file=str(good))
    assert "secret" not in death_snapshot(w, None, False, 1).error
    w.uid = os.geteuid()
    assert "secret" in death_snapshot(w, None, False, 1).error


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to have another uid's worker")
def test_a_root_only_file_named_by_another_uids_worker_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "root-only.json"
    secret.write_text(ERROR_JSON)
    os.chmod(secret, 0o600)
    w = Worker(job="j", rank=0, world_size=1, local_rank=0, pid=1, training_tid=1, host="h", error_file=str(secret),
               uid=10001)
    assert "secret" not in death_snapshot(w, None, False, 1).error


# ---------------------------------------------------------------- item 5: the agent's metrics listener
def _get(port: int, path: str, source: str = "127.0.0.1", timeout: float = 3.0) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def _closed_at_once(s: socket.socket) -> bool:
    s.settimeout(2.0)
    try:
        return s.recv(1) == b""
    except OSError:
        return True


def test_the_metrics_listener_caps_connections_and_drops_idle_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's 1,009 idle connections, scaled: cap 16, 8 per client address, read timeout
    0.5 s. Below the caps /healthz answers at once; past them the extra connections are closed at
    once (no thread, no fd kept) while another address (the kubelet's) still gets /healthz; once
    the idle ones time out the first address is served again."""
    from perftracker.agent.daemon import agent_metrics as am

    monkeypatch.setattr(am, "MAX_CONNECTIONS", 16)
    monkeypatch.setattr(am, "MAX_PER_CLIENT", 8)
    monkeypatch.setattr(am._QuietHandler, "timeout", 0.5)
    server = am.MetricsServer(am.Metrics(), "127.0.0.1", 0)
    idle: list[socket.socket] = []
    try:
        base = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(7)]
        time.sleep(0.1)
        assert _get(server.port, "/healthz") == 200  # the client's 8th slot
        more = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(41)]
        idle += more
        time.sleep(0.2)
        assert threading.active_count() <= base + 8
        closed = sum(_closed_at_once(s) for s in more[1:])
        assert closed == 40 and server._httpd.refused >= 40  # all but the one that took the 8th slot
        assert _get(server.port, "/healthz", source="127.0.0.2") == 200  # another address is served
        time.sleep(0.8)  # the idle ones time out
        assert _get(server.port, "/healthz") == 200
        assert threading.active_count() <= base + 1
    finally:
        for s in idle:
            s.close()
        server.close()


# ---------------------------------------------------------------- low: a frame nested 100,000 levels deep
def test_a_deeply_nested_frame_is_a_bad_body_the_reader_can_skip() -> None:
    from perftracker.wire import framing as wire

    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(wire.BadFrameBody, match="nested too deeply"):
        wire.decode_body(deep)
    with pytest.raises(wire.BadFrameBody, match="not valid JSON"):
        wire.decode_body(b"{")
    shallow = b"[" * 50 + b"]" * 50  # valid JSON, not a message: the stream's own WireError, not skippable
    with pytest.raises(wire.WireError) as info:
        wire.decode_body(shallow)
    assert not isinstance(info.value, wire.BadFrameBody)
