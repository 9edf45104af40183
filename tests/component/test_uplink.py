"""The agent's HTTP client: retries with backoff on connection errors and 5xx, none on 4xx, tokens."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from perftracker.agent.daemon.localizer_client import Uplink, UplinkError, resolve_token

from tests.service_helpers import TOKEN, LocalizerProcess, make_pattern_set, workers


class _Scripted(BaseHTTPRequestHandler):
    """Answers from a script of statuses, counting requests (a stand-in server for status handling)."""

    script: list[int] = []
    seen: list[tuple[str, str, str]] = []

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        status = type(self).script.pop(0) if type(self).script else 200
        body = b'{"error": "scripted failure"}' if status >= 400 else b'{"ok": true, "jobs": ["j"]}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[tuple[str, type[_Scripted]]]:
    handler = type("H", (_Scripted,), {"script": [], "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_retries_5xx_and_429_with_backoff_then_succeeds(scripted: tuple[str, type[_Scripted]]) -> None:
    url, h = scripted
    h.script[:] = [503, 500, 429]
    up = Uplink(url, "tok", retries=5, backoff_s=0.05)
    t0 = time.monotonic()
    assert up.jobs() == ["j"]
    assert len(h.seen) == 4 and all(a == "Bearer tok" for _, _, a in h.seen)
    assert time.monotonic() - t0 >= 0.05 * 0.5 * (1 + 2 + 4)  # exponential backoff with jitter >= 50 %


def test_4xx_is_not_retried_and_carries_the_message(scripted: tuple[str, type[_Scripted]]) -> None:
    url, h = scripted
    h.script[:] = [422, 200]
    up = Uplink(url, "tok", retries=5, backoff_s=0.01)
    with pytest.raises(UplinkError, match="422: scripted failure") as e:
        up.register("j", "a", "h", [])
    assert e.value.status == 422 and len(h.seen) == 1


def test_gives_up_after_retries_when_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    up = Uplink(f"http://127.0.0.1:{port}", "tok", retries=3, backoff_s=0.02, timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(UplinkError, match="unreachable after 4 attempt") as e:
        up.request("GET", "/v1/healthz")
    assert e.value.status == 0 and time.monotonic() - t0 < 5


def test_waits_for_a_localizer_that_starts_late(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = LocalizerProcess(tmp_path, tmp_path / "store.sqlite", port=port)
    up = Uplink(f"http://127.0.0.1:{port}", TOKEN, retries=60, backoff_s=0.1, max_backoff_s=0.5)
    starter = threading.Timer(0.3, proc.start)
    starter.start()
    try:
        reg = up.register("late", "agent-0", "node0", workers(range(1), 1))  # retried until it listens
        assert reg["ranks"] == [0]
        starter.join()
        session, joined = up.create_trigger("late", "cli", window_s=1)
        assert not joined
        notice = up.poll_trigger("late", timeout_s=5)
        assert notice is not None and notice.session == session and notice.window_s == 1.0
        assert up.upload_patterns(make_pattern_set("late", session, 0, 1))["stored"]
    finally:
        starter.join()
        proc.stop()


def test_resolve_token_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERFTRACKER_TOKEN", raising=False)
    monkeypatch.delenv("PERFTRACKER_TOKEN_FILE", raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert resolve_token(run_dir=run_dir) == ""
    (run_dir / "token").write_text("from-run-dir\n")
    assert resolve_token(run_dir=run_dir) == "from-run-dir"
    f = tmp_path / "tok"
    f.write_text("from-file\n")
    monkeypatch.setenv("PERFTRACKER_TOKEN_FILE", str(f))
    assert resolve_token(run_dir=run_dir) == "from-file"
    monkeypatch.setenv("PERFTRACKER_TOKEN", "from-env")
    assert resolve_token(run_dir=run_dir) == "from-env"
    assert resolve_token("explicit", run_dir=run_dir) == "explicit"


def test_rejects_non_http_url() -> None:
    with pytest.raises(UplinkError, match="must start with http"):
        Uplink("127.0.0.1:8765", "t")
