"""The node agent as a real process with its embedded localizer: registration, triggers, windows,
samplers + summarizer subprocesses, uploads, reports, metrics, exactly-one-agent, idle exit.

Workers are emulated at the wire level (a real socket, real raw-window files); the torchrun tests
(test_run_cli.py, test_reliability.py) use real training processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from agent_helpers import AgentProc, WireWorker, cleanup, env_for_tests, short_run_dir, wait_until

from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType


@pytest.fixture
def run_dir():
    d = short_run_dir("ad")
    yield d
    cleanup(d)


def _answer(worker: WireWorker, out: Path, result: dict) -> None:
    try:
        msg = worker.recv(30)
        while msg["type"] != "start_window":
            msg = worker.recv(30)
        result["start"] = msg
        result["raw"] = worker.answer_window(msg, out)
    except Exception as exc:  # surfaced by the assertions below
        result["error"] = repr(exc)


def test_trigger_to_report_through_a_real_agent(run_dir: Path, tmp_path: Path) -> None:
    agent = AgentProc(run_dir, tmp_path / "runs", "--metrics-port", "0", "--poll-timeout-s", "5")
    try:
        info = agent.wait_ready()
        w0 = WireWorker(run_dir, 0, 2, compute_ms=8.0)
        w1 = WireWorker(run_dir, 1, 2, compute_ms=24.0)  # rank 1 is 3x slower in compute
        assert w0.ack == {"type": "ack", "ok": True, "agent_id": info["agent_id"], "features": ["job_link"]}
        up = agent.uplink()
        wait_until(lambda: "jobT" in up.jobs(), 10, what="job registration at the localizer")
        for w in (w0, w1):
            w.send(MessageType.ITER_STATS, iteration=50, recent_ms=[11.0, 11.5], mean_ms=11.2, min_ms=11.0, phase="watching")
            w.send(MessageType.HEARTBEAT, iteration=50, phase="watching")
        results: list[dict] = [{}, {}]
        threads = [threading.Thread(target=_answer, args=(w, run_dir / "windows", r)) for w, r in zip((w0, w1), results, strict=True)]
        for t in threads:
            t.start()
        w1.send(MessageType.TRIGGER, reason="slowdown", detail={"ratio": 1.4})  # a worker trigger
        for t in threads:
            t.join(60)
        assert all("error" not in r for r in results), results
        session = results[0]["start"]["session"]
        assert results[1]["start"]["session"] == session
        report = wait_until(lambda: up.get_report(session), 40, step_s=0.3, what="stored report")
        assert report.ranks_reported == (0, 1) and report.ranks_missing == ()
        assert "rank 1" in report.trigger_reason
        with contextlib.closing(sqlite3.connect(tmp_path / "runs" / "localizer.sqlite")) as db:  # one upload per node
            assert db.execute("SELECT ranks FROM pattern_batches WHERE session=?", (session,)).fetchall() == [("[0, 1]",)]
        assert not results[0]["raw"].exists(), "raw files are removed after upload"
        # metrics: per-rank iteration time, phase, sessions
        text = urllib.request.urlopen(info["metrics_url"], timeout=5).read().decode()
        from tests.component.test_metrics import sample

        assert sample(text, 'perftracker_iteration_duration_seconds_count{training_job="jobT",rank="1"}') == 2
        assert sample(text, 'perftracker_iteration_duration_seconds_bucket{training_job="jobT",le="0.025",rank="1"}') == 2
        assert sample(text, 'perftracker_iterations_total{training_job="jobT",rank="0"}') == 50
        assert sample(text, 'perftracker_detector_phase{training_job="jobT",phase="watching",rank="0"}') == 1
        assert sample(text, 'perftracker_sessions_total{state="uploaded"}') == 1
        assert sample(text, 'perftracker_workers{training_job="jobT"}') == 2
        health = urllib.request.urlopen(info["metrics_url"].replace("/metrics", "/healthz"), timeout=5)
        assert health.status == 200
        w0.close()
        w1.close()
    finally:
        agent.kill(signal.SIGTERM)
    assert agent.proc.returncode == 0, agent.log()
    assert not os.path.exists(wire.socket_path(run_dir)), "a clean stop removes the socket"


def test_a_session_opened_during_the_previous_one_runs_after_it(run_dir: Path, tmp_path: Path) -> None:
    """A slowdown trigger after the open session's window opens the next session (localizer); the
    agent starts that window only when the worker's previous session is done, then reports both."""
    agent = AgentProc(run_dir, tmp_path / "runs", "--poll-timeout-s", "5")
    try:
        agent.wait_ready()
        w = WireWorker(run_dir, 0, 1)
        up = agent.uplink()
        wait_until(lambda: "jobT" in up.jobs(), 10, what="job registration at the localizer")
        s1, _ = up.create_trigger("jobT", "first", window_s=0.3)
        start1 = w.recv(30)
        while start1["type"] != "start_window":
            start1 = w.recv(30)
        assert start1["session"] == s1
        time.sleep(2.6)  # past s1's window and the join slack; s1 still waits for this worker
        s2, joined = up.create_trigger("jobT", "second", window_s=0.3)
        assert not joined and s2 != s1
        time.sleep(1.0)  # time enough for the agent to (wrongly) start s2's window at once
        w.sock.settimeout(0.2)
        early = []
        try:
            while True:
                early.append(wire.recv_message(w.sock))
        except wire.ConnectionClosed:  # the 0.2 s receive timeout: nothing more was sent
            pass
        assert not [m for m in early if m["type"] == "start_window"], early
        w.answer_window(start1, run_dir / "windows")
        start2 = w.recv(30)
        while start2["type"] != "start_window":
            start2 = w.recv(30)
        assert start2["session"] == s2
        w.answer_window(start2, run_dir / "windows")
        for s in (s1, s2):
            report = wait_until(lambda s=s: up.get_report(s), 40, step_s=0.3, what=f"report of {s}")
            assert report.ranks_reported == (0,) and report.ranks_missing == ()
        w.close()
    finally:
        agent.kill(signal.SIGTERM)


def test_worker_whose_window_fails_is_named_missing(run_dir: Path, tmp_path: Path) -> None:
    # the session waits 8 s past its window for rank 1, whose window failed: rank 0, still being
    # summarized or uploaded, keeps it open by the agent's heartbeats (busy_extend_s)
    agent = AgentProc(run_dir, tmp_path / "runs", "--no-samplers", "--collect-grace-s", "8",
                      "--poll-timeout-s", "5")
    try:
        agent.wait_ready()
        w0, w1 = WireWorker(run_dir, 0, 2), WireWorker(run_dir, 1, 2)
        up = agent.uplink()
        wait_until(lambda: "jobT" in up.jobs(), 10, what="registration")
        session, _ = up.create_trigger("jobT", "cli", 1.0)
        m0, m1 = w0.recv(), w1.recv()
        assert m0["type"] == m1["type"] == "start_window" and m0["session"] == session
        w0.answer_window(m0, run_dir / "windows")
        w1.send(MessageType.WINDOW_DONE, session=session, raw_path="", start_ns=0, end_ns=0, error="disk full")
        report = wait_until(lambda: up.get_report(session), 60, step_s=0.3, what="partial report")
        assert report.status == "partial" and report.ranks_missing == (1,) and report.ranks_reported == (0,)
        assert "disk full" in agent.log()
    finally:
        agent.kill(signal.SIGTERM)


def test_a_session_no_local_rank_could_upload_sends_one_notice_each(run_dir: Path, tmp_path: Path) -> None:
    """No report will come from this node: each worker hears it (NOTICE), once, as one line of text;
    a node where one rank uploaded sends none (the report comes, partial)."""
    agent = AgentProc(run_dir, tmp_path / "runs", "--no-samplers", "--collect-grace-s", "30",
                      "--poll-timeout-s", "5")
    try:
        agent.wait_ready()
        w0, w1 = WireWorker(run_dir, 0, 2), WireWorker(run_dir, 1, 2)
        up = agent.uplink()
        wait_until(lambda: "jobT" in up.jobs(), 10, what="registration")
        session, _ = up.create_trigger("jobT", "cli", 1.0)
        for w in (w0, w1):
            m = w.recv()
            assert m["type"] == "start_window"
            w.send(MessageType.WINDOW_DONE, session=session, raw_path="", start_ns=0, end_ns=0, error="disk full")
        notices = [w.recv(30) for w in (w0, w1)]
        assert [n["type"] for n in notices] == ["notice", "notice"] and notices[0]["key"] == "session-failed"
        assert notices[0]["text"].startswith(f"perftracker: session {session}: no report will come from 2 rank(s)")
        assert "disk full" in notices[0]["text"] and "\n" not in notices[0]["text"]
    finally:
        agent.kill(signal.SIGTERM)


def test_exactly_one_agent_per_run_dir(run_dir: Path, tmp_path: Path) -> None:
    a = AgentProc(run_dir, tmp_path / "runs1")
    try:
        a.wait_ready()
        b = subprocess.run([sys.executable, "-m", "perftracker", "agent", "--run-dir", str(run_dir), "--runs-dir",
                            str(tmp_path / "runs2"), "--embedded-localizer"], env=env_for_tests(),
                           capture_output=True, text=True, timeout=30)
        assert b.returncode == 0 and "another agent already runs" in b.stderr
        assert a.proc.poll() is None and os.path.exists(wire.socket_path(run_dir))
    finally:
        a.kill(signal.SIGTERM)


def test_idle_agent_exits_after_its_workers_leave(run_dir: Path, tmp_path: Path) -> None:
    a = AgentProc(run_dir, tmp_path / "runs", "--idle-exit-s", "1")
    try:
        a.wait_ready()
        w = WireWorker(run_dir, 0, 1)
        time.sleep(2.0)
        assert a.proc.poll() is None, "a connected worker keeps the agent alive"
        w.close()
        a.proc.wait(15)
        assert a.proc.returncode == 0
        assert not os.path.exists(wire.socket_path(run_dir))
    finally:
        a.kill()


def test_bad_frames_drop_only_that_connection(run_dir: Path, tmp_path: Path) -> None:
    import socket
    import struct

    a = AgentProc(run_dir, tmp_path / "runs")
    try:
        a.wait_ready()
        s = socket.socket(socket.AF_UNIX)
        s.connect(wire.socket_path(run_dir))
        s.sendall(struct.pack(">I", 10) + b"not json!!")
        s.settimeout(5)
        assert s.recv(10) == b""  # the agent closed it
        s.close()
        w = WireWorker(run_dir, 0, 1)  # and still serves the next worker
        assert w.ack["ok"] is True
        w.close()
    finally:
        a.kill(signal.SIGTERM)


def test_agent_with_a_remote_localizer_and_token_file(run_dir: Path, tmp_path: Path) -> None:
    """The Kubernetes shape: `perftracker localizer` as its own service, the agent pointed at it."""
    import json

    from perftracker.agent.daemon.localizer_client import Uplink

    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123\n")
    ready = tmp_path / "ready.json"
    loc = subprocess.Popen([sys.executable, "-m", "perftracker", "localizer", "--port", "0", "--store",
                            str(tmp_path / "loc.sqlite"), "--token-file", str(token_file), "--ready-file", str(ready)],
                           env=env_for_tests(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agent = None
    try:
        url = wait_until(lambda: ready.exists() and json.loads(ready.read_text())["url"], 30, what="localizer")
        env = env_for_tests(PERFTRACKER_LOCALIZER_URL=url, PERFTRACKER_TOKEN_FILE=str(token_file))
        agent = subprocess.Popen([sys.executable, "-m", "perftracker.agent", "--run-dir", str(run_dir), "--no-samplers",
                                  "--poll-timeout-s", "5"], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        wait_until(lambda: os.path.exists(wire.socket_path(run_dir)), 30, what="agent socket")
        w = WireWorker(run_dir, 0, 1, job="remote")
        up = Uplink(url, "s3cret-token-0123", retries=1)
        wait_until(lambda: "remote" in up.jobs(), 20, what="registration")
        session, _ = up.create_trigger("remote", "cli", 1.0)
        msg = w.recv(30)
        assert msg["type"] == "start_window" and msg["session"] == session
        w.answer_window(msg, run_dir / "windows")
        report = wait_until(lambda: up.get_report(session), 60, step_s=0.3, what="report")
        assert report.ranks_reported == (0,) and report.status == "complete"
        w.close()
    finally:
        for p in (agent, loc):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(20)
    assert agent is not None and agent.returncode == 0
