"""Issue 17: the localizer under attack. Slow clients (2), sessions past 1,000 (3), write scope per
job and TLS (4), bounded memory (5), tokens (6), bad input (7), strict JSON out (8), counts after a
failed commit (9), file modes (11). Real processes, sockets and sqlite throughout; the disk-full
case is a real RLIMIT_FSIZE in a subprocess."""

from __future__ import annotations

import argparse
import datetime
import http.client
import ipaddress
import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from perftracker.agent.daemon.localizer_client import Uplink, UplinkError
from perftracker.localizer.service.columns import ColumnCache
from perftracker.localizer.service.http_service import ServiceOptions
from perftracker.localizer.service.session.manager import OPEN, SessionManager, SessionOptions
from perftracker.localizer.service.tokens import check_token, parse_job_tokens
from perftracker.localizer.store.sqlite_store import SessionRecord, Store
from service_helpers import REPO, TOKEN, LocalizerProcess, ServiceThread, make_pattern_set, workers

from perftracker.errors import ConfigError
from perftracker.wire.patterns import batch_from_sets

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _strict(text: str | bytes) -> object:
    def bad(name: str) -> object:
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=bad)


def _raw(port: int, method: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request(method, path, body=body, headers={**AUTH, "Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# ---------------------------------------------------------------- item 2: slow and idle clients
def test_unfinished_headers_idle_sockets_and_slow_bodies_are_cut_off(tmp_path: Path) -> None:
    loc = LocalizerProcess(tmp_path, tmp_path / "s.sqlite",
                           extra=["--header-timeout-s", "1", "--body-timeout-s", "1", "--max-connections", "64"])
    loc.start()
    idle: list[socket.socket] = []
    try:
        s = socket.create_connection(("127.0.0.1", loc.port))
        s.sendall(b"GET /v1/healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
        t0 = time.monotonic()
        s.settimeout(10)
        assert s.recv(100) == b""  # closed by the server
        assert time.monotonic() - t0 < 5
        s.close()

        for _ in range(150):  # more idle sockets than the cap
            idle.append(socket.create_connection(("127.0.0.1", loc.port)))
        time.sleep(0.5)  # held idle a moment (connections younger than 0.25 s are spared eviction)
        t0 = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", loc.port, timeout=5)
        conn.request("GET", "/v1/healthz")
        assert conn.getresponse().status == 200
        assert time.monotonic() - t0 < 2.0
        conn.close()
        closed = 0
        for c in idle:
            c.settimeout(0.05)
            try:
                closed += c.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed += 0
        assert closed >= 150 - 64  # the oldest idle ones made room

        s = socket.create_connection(("127.0.0.1", loc.port))  # headers, then a body that never comes
        s.sendall(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"job\"")
        s.settimeout(10)
        assert s.recv(200).startswith(b"HTTP/1.1 408")
        s.close()
    finally:
        for c in idle:
            c.close()
        loc.stop()


def test_with_ulimit_1024_healthz_answers_past_1100_idle_sockets(tmp_path: Path) -> None:
    """The review's case: before, EMFILE, and /v1/healthz timed out for 30 s."""
    loc = LocalizerProcess(tmp_path, tmp_path / "s.sqlite", nofile=1024, extra=["--header-timeout-s", "5"])
    loc.start()
    idle: list[socket.socket] = []

    def connect(_: int) -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", loc.port), timeout=5)
        except OSError:
            return None

    try:
        # many at once: one at a time, every ~33rd connect found the small listen backlog full and
        # waited out the 1 s SYN retransmission (25 s in all)
        with ThreadPoolExecutor(64) as pool:
            idle.extend(s for s in pool.map(connect, range(1100)) if s is not None)
        time.sleep(0.5)
        t0 = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", loc.port, timeout=10)
        conn.request("GET", "/v1/healthz")
        assert conn.getresponse().status == 200
        assert time.monotonic() - t0 < 2.0
        conn.close()
        assert "out of system resource" not in (tmp_path / "localizer.log").read_text()  # asyncio's EMFILE
    finally:
        for c in idle:
            c.close()
        loc.stop()


# ---------------------------------------------------------------- item 3: more than 1,000 sessions
def _seed_sessions(store: Store, n: int, now_ns: int) -> None:
    with store.transaction():
        for i in range(n):
            store.insert_session(SessionRecord(seq=0, session=f"s{i:05d}", job="j", kind="slowdown", reason="r",
                                               window_s=1.0, state=OPEN, opened_ns=now_ns - 10**9,
                                               deadline_ns=now_ns + 3600 * 10**9 if i < n - 1 else now_ns - 1,
                                               expected=(0,)))


def test_listing_pages_past_1000_sessions_and_the_newest_deadline_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    store = Store(path)
    _seed_sessions(store, 1002, time.time_ns())
    due = SessionManager(store).due()
    assert [s.session for s in due] == ["s01001"]  # the newest, past its deadline
    store.close()
    with ServiceThread(path) as svc:
        up = Uplink(svc.url, TOKEN)
        status, first = up.request("GET", "/v1/sessions")
        assert len(first["sessions"]) == 1000 and first["next"] is not None
        everything = up.list_sessions()
        assert [s["session"] for s in everything] == [f"s{i:05d}" for i in range(1002)]
        newest = up.request("GET", "/v1/sessions?order=desc&limit=1")[1]
        assert newest["sessions"][0]["session"] == "s01001"
        assert up.request("GET", "/v1/sessions?order=desc&limit=1&before=" + str(newest["next"]))[1][
            "sessions"][0]["session"] == "s01000"
        with pytest.raises(UplinkError, match="400"):
            up.request("GET", "/v1/sessions?limit=5000")


# ---------------------------------------------------------------- item 4: write scope, job tokens, TLS
def test_a_rank_belongs_to_its_first_agent_until_that_agent_is_dead(tmp_path: Path) -> None:
    opts = ServiceOptions(sessions=SessionOptions(default_window_s=30, collect_grace_s=60, agent_dead_s=2.0))
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        owner, intruder = Uplink(svc.url, TOKEN, retries=0), Uplink(svc.url, TOKEN, retries=0)
        owner.register("train", "agent-a", "node-a", workers([0], 2))
        intruder.register("train", "agent-b", "node-b", workers([1], 2))
        session, _ = owner.create_trigger("train", "t")
        mine = make_pattern_set("train", session, 0, 2, seed=1)
        owner.upload_patterns(mine)
        stored = svc.store.pattern_sets(session)[0]
        with pytest.raises(UplinkError) as exc:
            intruder.register("train", "agent-b", "node-b", workers([0], 2))
        assert exc.value.status == 409 and "belongs to agent 'agent-a'" in str(exc.value)
        with pytest.raises(UplinkError) as exc:  # another agent's upload for rank 0
            intruder.upload_patterns(make_pattern_set("train", session, 0, 2, seed=2))
        assert exc.value.status == 409
        with pytest.raises(UplinkError) as exc:  # posing as agent-a without its key
            Uplink(svc.url, TOKEN, retries=0).register("train", "agent-a", "node-x", workers([0], 2))
        assert exc.value.status == 409
        assert svc.store.pattern_sets(session)[0] == stored  # the acknowledged upload is untouched
        owner.upload_patterns(mine)  # the owner may repeat its own upload
        owner.heartbeat("train", "agent-a", [{"rank": 0, "iteration": 5, "phase": "watching"}])
        time.sleep(2.2)  # agent-a is not heard from: declared dead
        intruder.register("train", "agent-b", "node-b", workers([0, 1], 2))  # takes rank 0 over


def test_job_tokens_reach_only_their_jobs(tmp_path: Path) -> None:
    job_token = "job-a-token-0123456789"
    opts = ServiceOptions(job_tokens={job_token: ("job-a*",)})
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        admin, scoped = Uplink(svc.url, TOKEN, retries=0), Uplink(svc.url, job_token, retries=0)
        admin.register("job-b", "agent-b", "n", workers([0], 1))
        admin.create_trigger("job-b", "t")
        scoped.register("job-a1", "agent-a", "n", workers([0], 1))
        scoped.create_trigger("job-a1", "t")
        with pytest.raises(UplinkError) as exc:
            scoped.register("job-b", "agent-x", "n", workers([1], 2))
        assert exc.value.status == 403
        assert scoped.jobs() == ["job-a1"]
        assert {s["job"] for s in scoped.list_sessions()} == {"job-a1"}
        assert {s["job"] for s in admin.list_sessions()} == {"job-a1", "job-b"}
    with pytest.raises(ConfigError, match="characters"):
        parse_job_tokens({"short": ["j"]})


def _self_signed(tmp: Path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "perftracker-localizer")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "tls.crt", tmp / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_tls_between_agent_and_localizer(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    with ServiceThread(tmp_path / "s.sqlite", ServiceOptions(tls_cert=cert, tls_key=key)) as svc:
        assert svc.url.startswith("https://")
        up = Uplink(svc.url, TOKEN, retries=0, ca_file=cert)
        assert up.healthz()["ok"] is True
        up.register("tls-job", "a", "n", workers([0], 1))
        with pytest.raises(UplinkError):  # the system CAs do not know this certificate
            Uplink(svc.url, TOKEN, retries=0).healthz()
        plain = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=5)
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            plain.request("GET", "/v1/healthz")
            plain.getresponse()
        plain.close()
        ctx = ssl.create_default_context(cafile=cert)
        with socket.create_connection(("127.0.0.1", svc.port)) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")


# ---------------------------------------------------------------- item 5: bounded memory
def test_kept_arrays_are_bounded_and_a_session_reads_the_rest_from_the_store(tmp_path: Path) -> None:
    sets = [make_pattern_set("j", "s1", r, 8, seed=r) for r in range(8)]
    cache = ColumnCache(1)  # smaller than one upload: the session is spilled, nothing kept
    cache.add(batch_from_sets(sets[:1]))
    assert cache.bytes == 0 and cache.evicted == 1 and cache.get("s1") is None
    cache.add(batch_from_sets(sets[1:2]))  # a spilled session keeps nothing of later uploads either
    assert cache.get("s1") is None
    store = Store(tmp_path / "s.sqlite")
    mgr = SessionManager(store, options=SessionOptions(max_cached_set_bytes=20_000))  # ~3 uploads' arrays
    from perftracker.localizer.service.validate import parse_registration

    mgr.register(parse_registration({"job": "j", "agent_id": "a", "workers": workers(range(8), 8)}))
    s, _ = mgr.trigger("j", "t")
    for r in range(8):
        mgr.accept_patterns(make_pattern_set("j", s.session, r, 8, seed=r))
        assert mgr.cache.bytes <= 20_000
    assert mgr.cache.get(s.session) is None  # spilled past the bound
    report = mgr.localize_now(s.session)
    assert report is not None and report.state == "done"
    assert store.get_report(s.session).ranks_reported == tuple(range(8))
    store.close()


def test_an_upload_that_inflates_past_the_bound_gets_413(tmp_path: Path) -> None:
    with ServiceThread(tmp_path / "s.sqlite") as svc:
        bomb = zlib.compress(b" " * (9 * 1024 * 1024), 9)  # 9 MiB of JSON whitespace in ~9 KiB
        status, body = _raw(svc.port, "POST", "/v1/sessions/s1/patterns", bomb,
                            {"Content-Type": "application/x-perftracker-patterns+zlib"})
        assert status == 413 and b"inflates past" in body


# ---------------------------------------------------------------- item 6: tokens
def test_tokens_are_persisted_and_weak_ones_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from perftracker.cli.localizer import resolve_or_create_token

    monkeypatch.delenv("PERFTRACKER_TOKEN", raising=False)
    monkeypatch.delenv("PERFTRACKER_TOKEN_FILE", raising=False)
    args = argparse.Namespace(token=None, token_file=None, store=str(tmp_path / "db" / "s.sqlite"))
    first = resolve_or_create_token(args)
    assert resolve_or_create_token(args) == first  # a restart keeps the token agents hold
    assert stat.S_IMODE(os.stat(tmp_path / "db" / "token").st_mode) == 0o600
    for weak in ("x", "REPLACE-ME-with-a-random-token", "aaaaaaaaaaaaaaaaaaaa", "changeme-changeme-123"):
        with pytest.raises(ConfigError):
            check_token(weak)
    env = dict(os.environ, PYTHONPATH=str(REPO), PERFTRACKER_DISABLE="1", PERFTRACKER_TOKEN="REPLACE-ME-with-a-random-token")
    out = subprocess.run([sys.executable, "-m", "perftracker", "localizer", "--port", "0", "--store",
                          str(tmp_path / "x.sqlite")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "placeholder" in out.stderr


# ---------------------------------------------------------------- items 7 and 8: bad input, strict output
def test_bad_input_gets_4xx_without_a_traceback_and_output_is_strict_json(tmp_path: Path) -> None:
    loc = LocalizerProcess(tmp_path, tmp_path / "s.sqlite", extra=["--collect-grace-s", "1", "--window-s", "0.5"])
    loc.start()
    try:
        up = Uplink(loc.url, TOKEN, retries=0)
        up.register("jb", "a", "n", workers([0, 1], 2))
        session, _ = up.create_trigger("jb", "t")
        good = make_pattern_set("jb", session, 0, 2, seed=0).to_dict()
        reg = {"job": "jb", "agent_id": "b", "host": "n", "workers": workers([5], 8)}
        cases = {
            "deep nesting": ("/v1/agents/register", b"[" * 50_000 + b"]" * 50_000),
            "deep object": ("/v1/heartbeat", json.dumps({"job": "jb", "agent_id": "a", "ranks": [
                {"rank": 0, "phase": "x", "d": json.loads("[" * 500 + "]" * 500)}]}).encode()),
            "Infinity in coords": (f"/v1/sessions/{session}/patterns",
                                   json.dumps({**good, "coords": {"dp": 1}}).replace('"dp": 1', '"dp": Infinity').encode()),
            "1e400": (f"/v1/sessions/{session}/patterns", json.dumps(good).replace('"iteration_ms": [', '"iteration_ms": [1e400, ', 1).encode()),
            "lone surrogate in host": ("/v1/agents/register", json.dumps(reg).replace('"host": "n"', '"host": "\\ud800"', 1).encode()),
            "iteration_ms nan string": (f"/v1/sessions/{session}/patterns", json.dumps({**good, "iteration_ms": ["nan"]}).encode()),
            "coords as string": (f"/v1/sessions/{session}/patterns", json.dumps({**good, "coords": {"dp": "x"}}).encode()),
            "not utf-8": ("/v1/agents/register", b'{"job": "\xff"}'),
        }
        for name, (path, body) in cases.items():
            status, answer = _raw(loc.port, "POST", path, body)
            assert 400 <= status < 500, (name, status, answer[:200])
            assert "error" in _strict(answer), name
        up.upload_patterns(make_pattern_set("jb", session, 0, 2, seed=0))
        up.upload_patterns(make_pattern_set("jb", session, 1, 2, seed=1))
        deadline = time.monotonic() + 60
        while (body := up.request("GET", f"/v1/sessions/{session}/report")[0]) == 202 and time.monotonic() < deadline:
            time.sleep(0.2)
        conn = http.client.HTTPConnection("127.0.0.1", loc.port, timeout=20)
        conn.request("GET", f"/v1/sessions/{session}/report", headers=AUTH)
        report = conn.getresponse().read()
        _strict(report)
        log = (tmp_path / "localizer.log").read_text()
        assert "Traceback" not in log and "internal error" not in log
    finally:
        loc.stop()


# ---------------------------------------------------------------- item 9: counts after a failed commit
_DISK_FULL = r"""
import json, resource, signal, sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from perftracker.localizer.service.session.manager import SessionManager
from perftracker.localizer.store.sqlite_store import Store, StoreError
from perftracker.localizer.service.validate import parse_registration
from service_helpers import make_pattern_set, workers

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
path = Path(sys.argv[1])
store = Store(path)
mgr = SessionManager(store)
mgr.register(parse_registration({"job": "j", "agent_id": "a", "workers": workers(range(400), 400)}))
s, _ = mgr.trigger("j", "t")
wal = Path(str(path) + "-wal")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (max(path.stat().st_size, wal.stat().st_size) + 400_000, hard))
ok = failed = 0
for r in range(400):
    try:
        mgr.accept_patterns(make_pattern_set("j", s.session, r, 400, seed=r))
        ok += 1
    except StoreError:
        failed += 1
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
print(json.dumps({"ok": ok, "failed": failed, "counted": len(mgr.view(s.session).uploaded),
                  "stored": len(Store(path).uploaded_ranks(s.session))}))
"""


def test_upload_counts_follow_the_store_when_commits_fail_on_a_full_disk(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _DISK_FULL, str(tmp_path / "s.sqlite"), str(REPO / "tests")],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(REPO), PERFTRACKER_DISABLE="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["failed"] > 0 and got["ok"] > 0, got  # the disk did fill up part way
    assert got["counted"] == got["stored"] == got["ok"], got


# ---------------------------------------------------------------- item 11: file modes
def test_store_and_reports_are_private(tmp_path: Path) -> None:
    from perftracker.localizer.service.localize_runner import LocalizeRunner
    from report_samples import slow_compute_report

    store = Store(tmp_path / "new" / "s.sqlite")
    store.put_report(slow_compute_report())
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o700
    for suffix in ("", "-wal", "-shm"):
        assert stat.S_IMODE(os.stat(str(tmp_path / "new" / "s.sqlite") + suffix).st_mode) == 0o600, suffix
    runner = LocalizeRunner(SessionManager(store), store.run_batch, report_dir=str(tmp_path / "reports"))
    try:
        runner._write_report_file(slow_compute_report())
    finally:
        runner.writer.close()
        runner.close()
    (path,) = (tmp_path / "reports").iterdir()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "reports").st_mode) == 0o700
    _strict(path.read_text())
    store.close()
