"""Issue 33, the parts that need a second uid, a socket or a command in a subprocess: nothing planted
is trusted (item 3), `-o` temporaries (6), server-chosen names (7, 10), safe output on the command
line (4, 5), trace files that are skipped, not fatal (8, 9), and report files with bad numbers
(minor). The "attacker" steps run as uid 10001 (root only; skipped elsewhere)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import cleanup, env_for_tests, short_run_dir
from perftracker.localizer.service.embedded import start_embedded
from perftracker.localizer.store.sqlite_store import SessionRecord, Store
from report_samples import slow_compute_report
from service_helpers import TOKEN, ServiceThread, workers

from bench.hardening import JsonServer
from perftracker.cli import output
from perftracker.errors import PerftrackerError
from perftracker.rundir import RunDirError, open_owned

REPO = Path(__file__).resolve().parents[2]
OTHER_UID = 10001
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"
RLO = "\u202e"


def _system_python() -> str:
    """A Python that uid 10001 may run (the suite's may live under a private home directory)."""
    for exe in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        if os.path.exists(exe) and os.stat(exe).st_mode & stat.S_IXOTH:
            return exe
    pytest.skip("no Python executable for other users")


def _as_other(code: str, *args: str, stdin: Any = None, stdout: Any = None) -> subprocess.Popen[str]:
    return subprocess.Popen([_system_python(), "-I", "-c", code, *args], user=OTHER_UID, group=OTHER_UID,
                            extra_groups=[], stdin=stdin, stdout=stdout, text=True, cwd="/",
                            env={"PATH": "/usr/bin:/bin"})


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perftracker", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env or env_for_tests())


@pytest.fixture
def shared() -> Iterator[Path]:
    """A shared, world-writable working directory (mode 1777, like /tmp)."""
    d = short_run_dir("pl")
    os.chmod(d, 0o1777)
    yield d
    cleanup(d)


# ---------------------------------------------------------------- item 3: a planted runs dir
_ATTACKER = r"""
import fcntl, http.server, json, os, sys, threading
d = sys.argv[1]
os.mkdir(d, 0o777); os.chmod(d, 0o777)
hits = []
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        hits.append(self.path); self.send_response(200); self.end_headers(); self.wfile.write(b'{"ok": true}')
    do_POST = do_GET
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
with open(os.path.join(d, "localizer.json"), "w") as f:
    f.write(json.dumps({"url": "http://127.0.0.1:%d" % srv.server_port, "pid": 1}))
with open(os.path.join(d, "token"), "w") as f:
    f.write("attacker-token-0123456789\n")
lock = open(os.path.join(d, "localizer.lock"), "a+"); fcntl.flock(lock, fcntl.LOCK_EX)
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps(hits), flush=True)
"""


@root_only
def test_a_runs_dir_another_user_planted_is_refused_and_their_server_never_hears_from_us(shared: Path) -> None:
    planted = shared / "perftracker-runs"
    attacker = _as_other(_ATTACKER, str(planted), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert attacker.stdout is not None and attacker.stdout.readline().strip() == "ready"
        with pytest.raises(RunDirError, match=f"runs dir {planted} is owned by uid {OTHER_UID}.*planted"):
            start_embedded(planted, timeout_s=2)
        agent = _cli("agent", "--run-dir", str(shared / "rd"), "--embedded-localizer", "--runs-dir", str(planted),
                     "--no-samplers", cwd=shared, timeout=60)
        assert agent.returncode != 0
        assert f"owned by uid {OTHER_UID}" in agent.stderr and "already running" not in agent.stderr
        assert "Traceback" not in agent.stderr
        for command in (["trigger", "--job", "j", "--no-wait"], ["sessions"], ["report"]):
            done = _cli(*command, cwd=shared)  # the default ./perftracker-runs
            assert done.returncode == 1 and f"owned by uid {OTHER_UID}" in done.stderr, (command, done.stderr)
            assert len(done.stderr.strip().splitlines()) == 1
        assert attacker.stdin is not None
        attacker.stdin.write("\n")
        attacker.stdin.flush()
        assert json.loads(attacker.stdout.readline()) == []  # no registration, no token, no request at all
    finally:
        attacker.kill()
        attacker.wait()


@root_only
def test_files_in_our_runs_dir_are_used_only_when_ours_and_closed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o755)
    token = runs / "token"
    token.write_text("planted-token-0123456789\n")
    os.chown(token, OTHER_UID, OTHER_UID)
    with pytest.raises(RunDirError, match=f"token file {token} is owned by uid {OTHER_UID}"):
        start_embedded(runs, timeout_s=2)
    os.chown(token, 0, 0)
    os.chmod(token, 0o666)
    with pytest.raises(RunDirError, match="writable by group or others"):
        start_embedded(runs, timeout_s=2)
    os.chmod(token, 0o600)
    (runs / "localizer.lock").unlink(missing_ok=True)
    (runs / "localizer.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunDirError, match="lock file .* is a symlink"):
        start_embedded(runs, timeout_s=2)
    assert not (tmp_path / "elsewhere").exists()
    (runs / "localizer.lock").unlink()
    handle = start_embedded(runs, timeout_s=20)  # all ours and closed: used, the token kept
    try:
        assert handle.owned and handle.token == "planted-token-0123456789"
    finally:
        handle.stop()
    os.chmod(runs, 0o777)
    with pytest.raises(RunDirError, match="writable by group or others"):
        start_embedded(runs, timeout_s=2)


def test_perftracker_run_never_writes_agent_log_through_a_symlink(tmp_path: Path) -> None:
    from perftracker.cli.run import LocalAgent

    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (runs / "agent.log").symlink_to(victim)
    with pytest.raises(RunDirError, match="agent log .* is a symlink"):
        LocalAgent.start(runs)  # refused before any agent starts
    assert victim.read_text() == "precious"
    (runs / "agent.log").unlink()
    (runs / "agent.log").write_text("earlier run\n")
    fd = open_owned(runs / "agent.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, what="agent log")
    os.write(fd, b"this run\n")
    os.close(fd)
    assert (runs / "agent.log").read_text() == "earlier run\nthis run\n"


# ---------------------------------------------------------------- item 6: -o temporaries
_PLANT = r"""
import os, sys
os.symlink(sys.argv[2], sys.argv[1])
"""


@root_only
def test_o_temporaries_are_new_files_never_a_link_another_user_planted(shared: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    victim = shared / "victim.txt"
    victim.write_text("precious")
    out = shared / "r.txt"
    names = {output._tmp_name(out) for _ in range(3)}
    assert len(names) == 3  # not predictable: random, not only the pid
    planted = shared / ".r.txt.planted.tmp"
    assert _as_other(_PLANT, str(planted), str(victim)).wait(30) == 0
    assert planted.is_symlink() and os.lstat(planted).st_uid == OTHER_UID
    monkeypatch.setattr(output, "_tmp_name", lambda _: planted)  # as if the attacker had guessed the name
    with pytest.raises(PerftrackerError, match="-o .*r.txt: cannot write"):
        output.write_file(out, lambda fh: fh.write("report\n"))
    with pytest.raises(PerftrackerError, match="cannot write"):
        output.check_writable(out)
    assert victim.read_text() == "precious" and not out.exists()
    monkeypatch.undo()
    output.write_file(out, lambda fh: fh.write("report\n"))  # a fresh name: written, renamed, nothing left over
    assert out.read_text() == "report\n" and victim.read_text() == "precious"
    assert sorted(p.name for p in shared.iterdir()) == [".r.txt.planted.tmp", "r.txt", "victim.txt"]


# ---------------------------------------------------------------- items 7 and 10: names from the network
class _FakeLocalizer:
    """A localizer that answers `perftracker trigger` with a session id of its choosing."""

    def __init__(self, session: str, jobs: list[str]) -> None:
        report = {**slow_compute_report().to_dict(), "session": session}
        routes = {
            "/v1/jobs": {"jobs": jobs},
            f"/v1/sessions/{session}": {"session": session, "state": "done", "deadline_ns": time.time_ns(),
                                        "uploaded": [0], "expected": [0], "window_s": 1.0, "error": "",
                                        "report_path": ""},
            f"/v1/sessions/{session}/report": report,
        }
        self.server = JsonServer(routes, post={"session": session, "joined": False})
        self.url = self.server.url

    def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize("session", ["../../pwn/planted-by-localizer", "s-1\n"])
def test_trigger_never_turns_a_session_id_from_the_localizer_into_a_path(tmp_path: Path, session: str) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    fake = _FakeLocalizer(session, ["j"])
    try:
        done = _cli("trigger", "--url", fake.url, "--token", TOKEN, "--job", "j", cwd=work)
    finally:
        fake.close()
    assert done.returncode == 1 and "is not a valid name" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "pwn").exists() and not (work / "perftracker-runs" / "reports").exists()


def test_trigger_keeps_a_private_copy_of_a_remote_report_under_a_valid_id(tmp_path: Path) -> None:
    fake = _FakeLocalizer("s-20261122-125301-7f3a", ["j"])
    try:
        done = _cli("trigger", "--url", fake.url, "--token", TOKEN, cwd=tmp_path)
    finally:
        fake.close()
    assert done.returncode == 0, done.stderr
    local = tmp_path / "perftracker-runs" / "reports" / "s-20261122-125301-7f3a.json"
    assert local.is_file() and stat.S_IMODE(local.stat().st_mode) == 0o600
    assert f"report: {local.relative_to(tmp_path)}" in done.stdout


def test_the_service_refuses_names_with_a_trailing_newline(tmp_path: Path) -> None:
    import http.client

    with ServiceThread(tmp_path / "s.sqlite") as svc:
        def post(job: str) -> int:
            conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=20)
            body = json.dumps({"job": job, "agent_id": "a", "host": "n", "workers": workers([0], 1)})
            conn.request("POST", "/v1/agents/register", body=body,
                         headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            status = conn.getresponse().status
            conn.close()
            return status

        assert post("teama-x\n") == 400
        assert post("teama-x") == 200
        assert svc.store.jobs() == ["teama-x"]  # no second job that looks like the first


# ---------------------------------------------------------------- items 4, 5 and minor: command output
def _hostile_report_file(path: Path) -> Path:
    d = slow_compute_report().to_dict()
    d["trigger_reason"] = f"loss spiked [/x] {OSC52} {RLO}evil"
    d["trigger"]["reason"] = d["trigger_reason"]  # the typed detection is what the report shows (issue 48)
    d["findings"][0]["label"] = d["findings"][0]["key"] = "model.forward[/layer]\x1b]0;PWNED\x07"
    path.write_text(json.dumps(d))
    return path


def test_report_and_sessions_text_escape_controls_and_markup(tmp_path: Path) -> None:
    src = _hostile_report_file(tmp_path / "r.json")
    shown = _cli("report", "--file", str(src), cwd=tmp_path, env=env_for_tests(COLUMNS="200"))
    assert shown.returncode == 0, shown.stderr
    written = _cli("report", "--file", str(src), "-o", str(tmp_path / "r.txt"), cwd=tmp_path)
    assert written.returncode == 0 and "MarkupError" not in written.stderr, written.stderr
    for text in (shown.stdout, (tmp_path / "r.txt").read_text()):
        assert "\x1b" not in text and RLO not in text
        assert "loss spiked [/x] \\x1b]52;c;cm0gLXJmIH4=\\x07 \\u202eevil" in text
        assert "model.forward[/layer]\\x1b]0;PWNED\\x07" in text
    store = Store(tmp_path / "s.sqlite")
    store.insert_session(SessionRecord(seq=0, session="s1", job="j", kind="slowdown",
                                       reason=f"spike {OSC52}[bold]x[/bold]{RLO}", window_s=1.0, state="open",
                                       opened_ns=time.time_ns(), deadline_ns=time.time_ns(), expected=(0,)))
    store.close()
    listed = _cli("sessions", "--store", str(tmp_path / "s.sqlite"), cwd=tmp_path, env=env_for_tests(COLUMNS="200"))
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout and RLO not in listed.stdout
    assert "spike \\x1b]52;c;cm0gLXJmIH4=\\x07[bold]x[/bold]\\u202e" in listed.stdout


def test_report_file_with_bad_numbers_is_one_error_line(tmp_path: Path) -> None:
    for change in ({"ranks_reported": ["x"]}, {"iteration_ms": {"0": [float("nan")]}}):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**slow_compute_report().to_dict(), **change}))
        done = _cli("report", "--file", str(path), cwd=tmp_path)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "bad.json" in done.stderr


# ---------------------------------------------------------------- items 8, 9: analyze skips, never aborts
def _retimed(src: Path, dst: Path, change: Any) -> None:
    doc = json.loads(gzip.decompress(src.read_bytes()))
    change(doc)
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_analyze_skips_bombs_and_out_of_range_numbers_with_a_warning(dlrm_dir: Path, tmp_path: Path) -> None:
    files = sorted(dlrm_dir.glob("*.json.gz"))
    traces = tmp_path / "traces"
    traces.mkdir()
    for f in files[:2]:
        shutil.copy(f, traces / f.name)

    def kernel(doc: dict[str, Any]) -> dict[str, Any]:
        return next(e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel")

    def step(doc: dict[str, Any]) -> dict[str, Any]:
        return next(e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep"))

    _retimed(files[2], traces / "worker2.pt.trace.json.gz", lambda d: kernel(d).update(ts=1e300))
    _retimed(files[3], traces / "worker3.pt.trace.json.gz", lambda d: kernel(d).update(ts=1e30))
    _retimed(files[4], traces / "worker4.pt.trace.json.gz", lambda d: step(d).update(dur=float("nan")))
    _retimed(files[5], traces / "worker5.pt.trace.json.gz", lambda d: d["distributedInfo"].update(rank=10**12))
    with gzip.open(traces / "worker6.pt.trace.json.gz", "wb") as fh:  # 0.1 MB that inflates to 64 MiB
        for _ in range(64):
            fh.write(b" " * 2**20)
    env = env_for_tests(PERFTRACKER_TRACE_MAX_BYTES=str(16 * 2**20), COLUMNS="200")
    done = _cli("analyze", str(traces), "--format", "json", "-j", "2", cwd=tmp_path, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    skipped = [ln for ln in done.stderr.splitlines() if "skipped" in ln and "worker" in ln]
    assert len(skipped) == 5, done.stderr
    assert "5 of 7 file(s) skipped; ranks [2, 3, 4, 5, 6] missing" in done.stderr
    report = json.loads(done.stdout)
    assert report["ranks_reported"] == [0, 1]
    assert report["ranks_missing"] == [2, 3, 4, 5, 6, 7]  # the traces' world_size is 8
    assert "gzip bomb" in done.stderr and "1e+300" in done.stderr and "10000000" in done.stderr
