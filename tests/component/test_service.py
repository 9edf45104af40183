"""The localizer service over real sockets: a `perftracker localizer` subprocess and the agent uplink."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from perftracker.agent.daemon.localizer_client import TriggerNotice, Uplink, UplinkError

from perftracker.wire.patterns import COLUMNS_CONTENT_TYPE, encode_sets
from tests.service_helpers import TOKEN, LocalizerProcess, make_pattern_set, workers

HAVE_LOCALIZE = importlib.util.find_spec("perftracker.localizer.diagnose.localize") is not None


@pytest.fixture(scope="module")
def localizer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalizerProcess]:
    tmp = tmp_path_factory.mktemp("loc")
    proc = LocalizerProcess(tmp, tmp / "store.sqlite", extra=["--window-s", "0.5", "--collect-grace-s", "1.5"],
                            max_body_bytes=64 * 1024)
    proc.start()
    yield proc
    proc.stop()


def _raw(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _wait_report(up: Uplink, session: str, timeout_s: float = 20.0) -> dict:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        s = up.get_session(session)
        if s["state"] in ("done", "failed"):
            return s
        time.sleep(0.1)
    raise AssertionError(f"session {session} did not close: {up.get_session(session)}")


def test_unauthenticated_requests_get_401(localizer: LocalizerProcess) -> None:
    assert _raw(localizer.url + "/v1/healthz")[0] == 200  # probes need no token
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": "Bearer"}):
        status, body = _raw(localizer.url + "/v1/sessions", headers=headers)
        assert status == 401 and "bearer token" in body["error"]
    status, _ = _raw(localizer.url + "/v1/agents/register", "POST", b'{"job": "j"}', {"Authorization": "Bearer nope"})
    assert status == 401
    with pytest.raises(UplinkError) as e:
        Uplink(localizer.url, "wrong-token").list_sessions()
    assert e.value.status == 401
    status, body = _raw(localizer.url + "/v1/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and isinstance(body["sessions"], list)


def test_trigger_long_poll_upload_and_report(localizer: LocalizerProcess) -> None:
    up = Uplink(localizer.url, TOKEN)
    reg = up.register("job-a", "agent-0", "node0", workers(range(4), 4))
    assert reg["ranks"] == [0, 1, 2, 3] and reg["open_session"] is None
    assert up.poll_trigger("job-a", timeout_s=0.2) is None  # 204 after the timeout

    got: list[TriggerNotice | None] = []
    poller = threading.Thread(target=lambda: got.append(up.poll_trigger("job-a", timeout_s=10)))
    poller.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    session, joined = up.create_trigger("job-a", "cli", window_s=0.5)
    poller.join(10)
    assert not joined and got and got[0] is not None and got[0].session == session
    assert time.monotonic() - t0 < 2.0  # the long poll woke on the trigger, not on its timeout
    assert up.create_trigger("job-a", "again") == (session, True)
    assert up.poll_trigger("job-a", after=session, timeout_s=0.1) is None

    for rank in range(4):
        ack = up.upload_patterns(make_pattern_set("job-a", session, rank, 4, slow=rank == 2), compressed=rank % 2 == 0)
        assert ack["stored"] and ack["rank"] == rank and ack["uploaded"] == rank + 1
    s = _wait_report(up, session)
    assert s["uploaded"] == [0, 1, 2, 3] and s["missing"] == []
    assert [x["session"] for x in up.list_sessions("job-a")] == [session]
    if HAVE_LOCALIZE:
        assert s["state"] == "done", s["error"]
        report = up.get_report(session)
        assert report is not None and report.session == session and report.status == "complete"
        assert set(report.ranks_reported) == {0, 1, 2, 3}
    else:
        assert s["state"] == "failed" and "perftracker.localizer.diagnose.localize" in s["error"]
        with pytest.raises(UplinkError) as e:
            up.get_report(session)
        assert e.value.status == 409


def test_deadline_closes_partial_and_names_missing_ranks(localizer: LocalizerProcess) -> None:
    up = Uplink(localizer.url, TOKEN)
    up.register("job-b", "agent-0", "node0", workers(range(2), 3))  # rank 2's agent never registers
    session, _ = up.create_trigger("job-b", "cli", window_s=0.5)
    assert up.get_report(session) is None  # 202 while collecting
    s = _wait_report(up, session)
    assert s["missing"] == [0, 1, 2]
    report = up.get_report(session)
    assert report is not None and report.status == "partial" and report.ranks_missing == (0, 1, 2)


def test_upload_errors_are_clear_4xx(localizer: LocalizerProcess) -> None:
    up = Uplink(localizer.url, TOKEN)
    up.register("job-c", "agent-0", "node0", workers(range(2), 2))
    session, _ = up.create_trigger("job-c", "cli", window_s=30)
    cases = [
        (make_pattern_set("job-c", "no-such-session", 0, 2), 404, "unknown session"),
        (make_pattern_set("job-c", session, 5, 6), 422, "rank 5 is not registered"),
        (make_pattern_set("job-x", session, 0, 2), 404, "unknown session .* for job 'job-x'"),
    ]
    for ps, status, msg in cases:
        with pytest.raises(UplinkError, match=msg) as e:
            up.upload_patterns(ps, compressed=False)
        assert e.value.status == status
    h = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    d = make_pattern_set("job-c", session, 0, 2).to_dict()
    d["schema_version"] = 99
    status, body = _raw(f"{localizer.url}/v1/sessions/{session}/patterns", "POST", json.dumps(d).encode(), h)
    assert status == 422 and "schema_version 99" in body["error"]
    columnar = encode_sets([make_pattern_set("job-c", session, 0, 2)])
    foreign = columnar[:4] + (7).to_bytes(2, "little") + columnar[6:]  # a format version from the future
    status, body = _raw(f"{localizer.url}/v1/sessions/{session}/patterns", "POST", foreign,
                        {**h, "Content-Type": COLUMNS_CONTENT_TYPE})
    assert status == 415 and "format version 7 is not supported" in body["error"]
    status, body = _raw(f"{localizer.url}/v1/sessions/{session}/patterns", "POST", columnar[:-9],
                        {**h, "Content-Type": COLUMNS_CONTENT_TYPE})
    assert status == 422 and "patterns batch" in body["error"]
    status, body = _raw(f"{localizer.url}/v1/sessions/{session}/patterns", "POST", columnar,
                        {**h, "Content-Type": "application/msgpack"})
    assert status == 415 and "unsupported content type" in body["error"]
    status, body = _raw(f"{localizer.url}/v1/sessions/{session}/patterns", "POST", b"x" * 70_000, h)
    assert status == 413
    bomb = zlib.compress(b"[" * 20_000_000)  # a small body that inflates past the bound
    status, body = _raw(f"{localizer.url}/v1/sessions/{session}/patterns", "POST", bomb,
                        {**h, "Content-Type": "application/x-perftracker-patterns+zlib"})
    assert status == 413 and "inflates" in body["error"]
    status, body = _raw(f"{localizer.url}/v1/agents/register", "POST", b'{"job": "a b", "agent_id": "x", "workers": []}', h)
    assert status == 400 and "register.job" in body["error"]
    status, body = _raw(f"{localizer.url}/v1/jobs/job-c/triggers", "POST", b'{"window_s": -1}', h)
    assert status == 400 and "window_s" in body["error"]
    assert up.get_session(session)["uploaded"] == []  # nothing bad was stored


def test_restart_mid_session_loses_no_acknowledged_pattern(tmp_path: Path) -> None:
    proc = LocalizerProcess(tmp_path, tmp_path / "store.sqlite", extra=["--collect-grace-s", "60"])
    url = proc.start()
    try:
        up = Uplink(url, TOKEN, retries=40, backoff_s=0.1, max_backoff_s=0.5)
        up.register("job-r", "agent-0", "node0", workers(range(5), 5))
        session, _ = up.create_trigger("job-r", "cli", window_s=1)
        # one node's ranks in one columnar upload, and one rank as zlib JSON
        ack = up.upload_pattern_batch([make_pattern_set("job-r", session, r, 5) for r in (0, 1)])
        acked = list(ack["ranks"]) if ack["stored"] else []
        acked += [2] if up.upload_patterns(make_pattern_set("job-r", session, 2, 5))["stored"] else []
        proc.kill()  # SIGKILL: no clean shutdown, no flush
        assert proc.proc is not None and proc.proc.returncode == -9
        # bring it back on the same port with the same store while the agent retries
        restarter = threading.Timer(0.5, proc.start)
        restarter.start()
        # retried until the new process answers
        ack = up.upload_pattern_batch([make_pattern_set("job-r", session, r, 5) for r in (3, 4)])
        restarter.join()
        assert ack["stored"] and ack["ranks"] == [3, 4] and ack["uploaded"] == 5
        s = _wait_report(up, session)
        assert s["uploaded"] == [0, 1, 2, 3, 4] and acked == [0, 1, 2]
        if HAVE_LOCALIZE:  # the new process reads the ranks committed before the kill from the store
            assert s["state"] == "done", s["error"]
            report = up.get_report(session)
            assert report is not None and set(report.ranks_reported) == set(range(5)) and report.status == "complete"
    finally:
        proc.stop()


def test_embedded_localizer_is_single_and_writes_reports(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from perftracker.localizer.service.embedded import discover, start_embedded
    from perftracker.localizer.service.http_service import ServiceOptions
    from perftracker.localizer.service.session.manager import SessionOptions

    runs = tmp_path / "perftracker-runs"
    opts = ServiceOptions(sessions=SessionOptions(default_window_s=0.2, collect_grace_s=0.3))
    with start_embedded(runs, options=opts) as emb:
        assert emb.owned and emb.url.startswith("http://127.0.0.1:")
        assert (runs / "token").stat().st_mode & 0o777 == 0o600
        assert discover(runs) == (emb.url, emb.token)
        # another process on the same runs dir attaches instead of starting a second one
        out = subprocess.run([sys.executable, "-c", "from perftracker.localizer.service.embedded import start_embedded as s; "
                              f"h = s({str(runs)!r}); print(h.url, h.owned)"],
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]),
                                      PERFTRACKER_DISABLE="1"))
        assert out.stdout.split() == [emb.url, "False"], out.stderr[-2000:]
        up = Uplink(emb.url, emb.token)
        up.register("job-e", "agent-0", "node0", workers(range(2), 2))
        session, _ = up.create_trigger("job-e", "cli")
        s = _wait_report(up, session)
        assert s["state"] == "done" and s["report_path"] == str(runs.resolve() / "reports" / f"{session}.json")
        written = json.loads(Path(s["report_path"]).read_text())
        assert written["session"] == session and written["ranks_missing"] == [0, 1]
    assert discover(runs) is None  # stopped: localizer.json removed, nothing answers


def test_cli_trigger_waits_for_report_and_sessions_lists_it(localizer: LocalizerProcess, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    up = Uplink(localizer.url, TOKEN)
    up.register("job-cli", "agent-0", "node0", workers(range(2), 2))

    def agent() -> None:  # a simulated agent: long-poll, then upload both ranks
        notice = up.poll_trigger("job-cli", timeout_s=30)
        assert notice is not None
        for r in range(2):
            up.upload_patterns(make_pattern_set("job-cli", notice.session, r, 2))

    t = threading.Thread(target=agent)
    t.start()
    env = dict(os.environ, PERFTRACKER_TOKEN=TOKEN, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    env.pop("PERFTRACKER_LOCALIZER_URL", None)
    env.pop("PERFTRACKER_JOB_ID", None)
    cli = [sys.executable, "-m", "perftracker"]
    out = subprocess.run([*cli, "trigger", "--url", localizer.url, "--job", "job-cli", "--window-s", "0.5"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    t.join(30)
    assert out.returncode == (0 if HAVE_LOCALIZE else 1), out.stderr
    session = out.stdout.split()[2]
    assert out.stdout.startswith(f"opened session {session} for job job-cli: window 0.5 s, 2 expected rank(s)")
    assert f"session {session}: " in out.stderr and "rank(s) uploaded" in out.stderr  # the progress line
    if HAVE_LOCALIZE:
        path = Path(out.stdout.split("report: ", 1)[1].split()[0])
        assert json.loads(path.read_text())["session"] == session

    listed = subprocess.run([*cli, "sessions", "--url", localizer.url, "--job", "job-cli"],
                            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert listed.returncode == 0 and session in listed.stdout and "2/2" in listed.stdout
    no_token = subprocess.run([*cli, "sessions", "--url", localizer.url], capture_output=True, text=True,
                              timeout=60, env={**env, "PERFTRACKER_TOKEN": "wrong"}, cwd=tmp_path)
    assert no_token.returncode == 1 and "401" in no_token.stderr
    from_store = subprocess.run([*cli, "sessions", "--store", str(localizer.store), "--format", "json", "--job", "job-cli"],
                                capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert [s["session"] for s in json.loads(from_store.stdout)] == [session]


def test_concurrent_uploads_are_all_acknowledged_and_stored(localizer: LocalizerProcess) -> None:
    from concurrent.futures import ThreadPoolExecutor

    n = 48
    up = Uplink(localizer.url, TOKEN)
    up.register("job-conc", "agent-0", "node0", workers(range(n), n))
    session, _ = up.create_trigger("job-conc", "cli", window_s=60)
    with ThreadPoolExecutor(16) as pool:  # concurrent requests share group commits
        acks = list(pool.map(lambda r: up.upload_patterns(make_pattern_set("job-conc", session, r, n)), range(n)))
    assert all(a["stored"] for a in acks)
    s = _wait_report(up, session)
    assert s["uploaded"] == list(range(n)) and s["state"] in ("done", "failed")


def test_a_localizer_that_does_not_read_the_columnar_version_gets_json_rank_by_rank(
        localizer: LocalizerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    from perftracker.wire import patterns as pattern_wire

    up = Uplink(localizer.url, TOKEN)
    up.register("job-v", "agent-0", "node0", workers(range(2), 2))
    session, _ = up.create_trigger("job-v", "cli", window_s=30)
    monkeypatch.setattr(pattern_wire, "FORMAT_VERSION", 2)  # this agent writes a version the localizer lacks
    ack = up.upload_pattern_batch([make_pattern_set("job-v", session, r, 2) for r in (0, 1)])
    assert ack["stored"] and ack["ranks"] == [0, 1] and ack["uploaded"] == 2
    assert up.get_session(session)["uploaded"] == [0, 1]
