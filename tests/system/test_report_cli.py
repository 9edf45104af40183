"""`perftracker report` end to end: real processes reading a JSON file, a real sqlite store and a
real localizer service over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from perftracker.localizer.render.json import load_schema
from perftracker.localizer.store.sqlite_store import SessionRecord, Store
from report_samples import clean_report, hang_report, slow_compute_report

from perftracker.model import Report

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("PERFTRACKER_STORE", None)
    return subprocess.run([sys.executable, "-m", "perftracker", *args], capture_output=True, text=True,
                          timeout=60, env=e, cwd=cwd or REPO)


def _seed_store(path: Path) -> None:
    store = Store(path)
    try:
        for i, report in enumerate((hang_report(), slow_compute_report())):
            store.insert_session(SessionRecord(
                seq=0, session=report.session, job=report.job, kind=report.kind, reason=report.trigger_reason,
                window_s=report.window_s, state="done", opened_ns=report.created_ns - 30 * 10**9,
                deadline_ns=report.created_ns, closed_ns=report.created_ns + i,
                expected=tuple(range(8))))
            store.put_report(report)
        # an open session without a report: it is newer, but "latest" must skip it
        store.insert_session(SessionRecord(
            seq=0, session="s-open", job="examples-train", kind="slowdown", reason="manual", window_s=20.0,
            state="open", opened_ns=time.time_ns(), deadline_ns=time.time_ns() + 10**11, expected=(0, 1)))
    finally:
        store.close()


def test_report_from_file_all_formats(tmp_path: Path) -> None:
    src = tmp_path / "r.json"
    src.write_text(json.dumps(slow_compute_report().to_dict()))
    text = _cli("report", "--file", str(src))
    assert text.returncode == 0, text.stderr
    assert "aten::addmm" in text.stdout and "ranks 0-2,4-7 (7)" in text.stdout
    out_json = tmp_path / "out.json"
    r = _cli("report", "--file", str(src), "--format", "json", "-o", str(out_json))
    assert r.returncode == 0, r.stderr
    data = json.loads(out_json.read_text())
    jsonschema.validate(data, load_schema())
    assert Report.from_dict(data) == Report.from_dict(slow_compute_report().to_dict())
    out_html = tmp_path / "out.html"
    r = _cli("report", "--file", str(src), "--format", "html", "-o", str(out_html))
    assert r.returncode == 0, r.stderr
    assert out_html.read_text().startswith("<!DOCTYPE html>")
    assert "wrote html report" in r.stderr


def test_report_bad_inputs_give_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "job": "j"}')
    r = _cli("report", "--file", str(bad))
    assert r.returncode == 1 and "bad.json" in r.stderr and "missing field 'session'" in r.stderr
    r = _cli("report", "--file", str(tmp_path / "nope.json"))
    assert r.returncode == 1 and "nope.json" in r.stderr and "cannot read" in r.stderr
    r = _cli("report", "--store", str(tmp_path / "nostore.sqlite"))
    assert r.returncode == 1 and "no localizer store" in r.stderr
    assert not (tmp_path / "nostore.sqlite").exists()  # reading never creates a store
    good = tmp_path / "good.json"
    good.write_text(json.dumps(clean_report().to_dict()))
    r = _cli("report", "other-session", "--file", str(good))
    assert r.returncode == 1 and "not 'other-session'" in r.stderr


def test_report_from_store_latest_and_by_session(tmp_path: Path) -> None:
    path = tmp_path / "localizer.sqlite"
    _seed_store(path)
    r = _cli("report", "--store", str(path))  # latest with a report: the slow-compute one
    assert r.returncode == 0, r.stderr
    assert slow_compute_report().session in r.stdout and "aten::addmm" in r.stdout
    r = _cli("report", hang_report().session, "--store", str(path), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert Report.from_dict(json.loads(r.stdout)).kind == "hang"
    r = _cli("report", "s-open", "--store", str(path))
    assert r.returncode == 1 and "no report yet" in r.stderr and "state open" in r.stderr
    r = _cli("report", "s-unknown", "--store", str(path))
    assert r.returncode == 1 and "unknown session" in r.stderr
    # the default store path is ./perftracker-runs/localizer.sqlite
    (tmp_path / "perftracker-runs").mkdir()
    os.replace(path, tmp_path / "perftracker-runs" / "localizer.sqlite")
    for suffix in ("-wal", "-shm"):
        if Path(str(path) + suffix).exists():
            os.replace(str(path) + suffix, str(tmp_path / "perftracker-runs" / "localizer.sqlite") + suffix)
    r = _cli("report", "latest", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert slow_compute_report().session in r.stdout


@pytest.mark.timeout(60)
def test_report_from_running_localizer(tmp_path: Path, free_port: int) -> None:
    path = tmp_path / "localizer.sqlite"
    _seed_store(path)
    ready = tmp_path / "ready.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PERFTRACKER_TOKEN"] = "t0ken-for-test-0123"
    proc = subprocess.Popen([sys.executable, "-m", "perftracker", "localizer", "--port", str(free_port),
                             "--store", str(path), "--ready-file", str(ready)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "localizer did not start"
            time.sleep(0.1)
        url = json.loads(ready.read_text())["url"]
        r = _cli("report", "--url", url, "--format", "json", env=env)
        assert r.returncode == 0, r.stderr
        assert Report.from_dict(json.loads(r.stdout)).session == slow_compute_report().session
        r = _cli("report", hang_report().session, "--url", url, env=env)
        assert r.returncode == 0 and "culprit" in r.stdout
        env_bad = dict(env, PERFTRACKER_TOKEN="wrong")
        r = _cli("report", "--url", url, env=env_bad)
        assert r.returncode == 1 and "HTTP 401" in r.stderr
        r = _cli("report", "s-open", "--url", url, env=env)
        assert r.returncode == 1 and "no report yet" in r.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)
