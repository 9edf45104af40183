"""Issue 33, items 1 and 2: bounded sizes from tenants, per-job limits and retention, on the real
service (in a thread, or a `perftracker localizer` process for the command-line options).

Each case has what must be refused (near the limit and far past it) and what must still pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from perftracker.agent.daemon.localizer_client import Uplink, UplinkError
from perftracker.localizer.service.bounds import MAX_COUNT, MAX_TIME_NS, MAX_WINDOW_NS
from perftracker.localizer.service.http_service import ServiceOptions
from perftracker.localizer.service.retention import DAY_S, Retention, RetentionOptions
from perftracker.localizer.service.session.manager import SessionOptions
from perftracker.localizer.store.rank_ranges import RankRanges
from perftracker.localizer.store.sqlite_store import SessionRecord, Store
from service_helpers import TOKEN, LocalizerProcess, ServiceThread, make_pattern_set, workers

from perftracker.model import Frame, HangSnapshot, Report
from perftracker.wire.patterns import COLUMNS_CONTENT_TYPE, encode_sets


def _status(fn: Any) -> int:
    try:
        fn()
    except UplinkError as exc:
        return exc.status
    return 200


def _post(url: str, path: str, body: Any, token: str = TOKEN) -> tuple[int, Any]:
    """One POST, its status and JSON answer (no retries: the agent's client retries a 429)."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _run(svc: ServiceThread, coro: Any) -> Any:
    assert svc._loop is not None
    return asyncio.run_coroutine_threadsafe(coro, svc._loop).result(60)


# ---------------------------------------------------------------- item 1: every integer bounded
def test_upload_integers_are_bounded_against_the_session(tmp_path: Path) -> None:
    opts = ServiceOptions(sessions=SessionOptions(default_window_s=600))
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        up = Uplink(svc.url, TOKEN, retries=0)
        up.register("b", "agent-b", "n", workers([0, 1], 2))
        session, _ = up.create_trigger("b", "t")
        good = make_pattern_set("b", session, 0, 2, seed=1)

        def with_(ps: Any = good, **kw: Any) -> Any:
            return dataclasses.replace(ps, **kw)

        refused = {
            "world 20,000,000": with_(world_size=20_000_000),
            "world 2**40": with_(world_size=2**40),
            "world 3 (one past)": with_(world_size=3),
            "world 1 (one short)": with_(world_size=1),
            "window_end 2**70": with_(window_end_ns=2**70),
            "window_end past int64 bound": with_(window_end_ns=MAX_TIME_NS + 1),
            "window longer than a day": with_(window_end_ns=good.window_start_ns + MAX_WINDOW_NS + 1),
            "window_start negative": with_(window_start_ns=-1),
            "pid 2**70": with_(pid=2**70),
            "coords 2**70": with_(coords={"dp": 2**70}),
            "executions 2**70": with_(patterns=(dataclasses.replace(good.patterns[0], executions=2**70),
                                                *good.patterns[1:])),
            "executions 2**53 + 1": with_(patterns=(dataclasses.replace(good.patterns[0], executions=MAX_COUNT + 1),
                                                    *good.patterns[1:])),
            "critical_ns -1": with_(patterns=(dataclasses.replace(good.patterns[0], critical_ns=-1),
                                              *good.patterns[1:])),
        }
        for what, ps in refused.items():
            assert _status(lambda ps=ps: up.upload_patterns(ps)) == 422, what
            assert _status(lambda ps=ps: up.upload_patterns(ps, compressed=False)) == 422, what
        for what in ("world 20,000,000", "world 3 (one past)", "window_end 2**70"):  # the columnar form too
            raw = encode_sets([refused[what]])
            assert _status(lambda raw=raw: up.request("POST", f"/v1/sessions/{session}/patterns", raw=raw,
                                                      content_type=COLUMNS_CONTENT_TYPE,
                                                      agent_key=up.agent_key("b", 0))) == 422, what
        assert up.get_session(session)["uploaded"] == []  # nothing refused was stored
        # at the limits: accepted
        edge = with_(window_end_ns=good.window_start_ns + MAX_WINDOW_NS,
                     patterns=(dataclasses.replace(good.patterns[0], executions=MAX_COUNT), *good.patterns[1:]))
        assert up.upload_patterns(edge)["stored"]
        up.upload_patterns(make_pattern_set("b", session, 1, 2, seed=2))
        end = time.monotonic() + 60
        while (report := up.get_report(session)) is None and time.monotonic() < end:
            time.sleep(0.1)
        assert report is not None and report.status == "complete" and report.ranks_reported == (0, 1)
        assert up.request("GET", "/v1/healthz")[0] == 200


def test_hang_snapshot_integers_are_bounded(tmp_path: Path) -> None:
    with ServiceThread(tmp_path / "s.sqlite") as svc:
        up = Uplink(svc.url, TOKEN, retries=0)
        up.register("h", "agent-h", "n", workers([0, 1], 2))
        snap = HangSnapshot("h", 0, 2, "n", 100, time.time_ns(), 41, 30.0, (Frame("dist.py", 10, "all_reduce"),))
        for what, bad in {"taken_ns 2**70": {"taken_ns": 2**70}, "taken_ns past the bound": {"taken_ns": MAX_TIME_NS + 1},
                          "taken_ns -1": {"taken_ns": -1}, "failed_ns 2**70": {"failed_ns": 2**70},
                          "last_iteration 2**70": {"last_iteration": 2**70}, "pid 2**64": {"pid": 2**64},
                          "rank 2 of 2": {"rank": 2}, "rank 2**70": {"rank": 2**70},
                          "world 3 on a 2-rank job": {"world_size": 3}, "world 10**12": {"world_size": 10**12},
                          "exit_code 2**40": {"exit_code": 2**40}}.items():
            assert _status(lambda bad=bad: up.upload_hang_snapshot(dataclasses.replace(snap, **bad))) == 422, what
        ack = up.upload_hang_snapshot(dataclasses.replace(snap, taken_ns=MAX_TIME_NS))  # at the bound: accepted
        assert ack["ok"] and ack["kind"] == "hang"


def test_registration_world_claims_cost_no_memory_and_listings_stay_small(tmp_path: Path) -> None:
    """One rank registered with world_size 10,000,000, sessions triggered: each expects 1,000,000
    ranks, kept as one range; a listing page's size does not depend on it."""
    opts = ServiceOptions(sessions=SessionOptions(default_window_s=600, join_slack_s=0.0,
                                                  max_open_sessions_per_job=5))
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        up = Uplink(svc.url, TOKEN, retries=0)
        with pytest.raises(UplinkError, match="400: .*outside"):  # past the registration cap
            up.register("w", "agent-w", "n", workers([0], 10_000_001))
        up.register("w", "agent-w", "n", workers([0], 10_000_000))
        up.register("small", "agent-s", "n", workers([0, 1], 2))
        small, _ = up.create_trigger("small", "t")
        status, answer = up.request("POST", "/v1/jobs/w/triggers", {"reason": "t", "window_s": 0.1})
        assert status == 201 and answer["n_expected"] == 1_000_000 and answer["expected_ranges"] == [[0, 1_000_000]]
        for _ in range(4):
            time.sleep(0.15)
            up.create_trigger("w", "t", window_s=0.1)
        rows = [s for s in svc.store.sessions(job="w", with_uploaded=False)]
        assert len(rows) == 5 and all(s.expected == RankRanges.span(1_000_000) for s in rows)
        t0 = time.monotonic()
        status, page = up.request("GET", "/v1/sessions")
        took = time.monotonic() - t0
        size = len(json.dumps(page))
        assert status == 200 and size < 6 * 1024 and took < 2.0, (size, took)
        listed = {s["session"]: s for s in page["sessions"]}
        w = listed[rows[0].session]
        assert w["n_expected"] == 1_000_000 and w["n_missing"] == 1_000_000 and w["missing_ranges"] == [[0, 1_000_000]]
        assert "expected" not in w and listed[small]["n_expected"] == 2
        # one session has its lists (on a worker thread); the small job's answer is as before
        assert up.get_session(small)["expected"] == [0, 1] and up.get_session(small)["missing"] == [0, 1]
        # an upload from that job must carry its registered world
        ps = make_pattern_set("w", rows[0].session, 0, 2, seed=1)
        assert _status(lambda: up.upload_patterns(ps)) == 422
        assert up.upload_patterns(dataclasses.replace(ps, world_size=10_000_000))["expected"] == 1_000_000
        assert up.request("GET", "/v1/healthz")[0] == 200


# ---------------------------------------------------------------- per-job limits
def test_open_sessions_per_job_are_capped_and_other_jobs_go_on(tmp_path: Path) -> None:
    opts = ServiceOptions(sessions=SessionOptions(join_slack_s=0.0, max_open_sessions_per_job=2,
                                                  triggers_per_minute=0))
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        up = Uplink(svc.url, TOKEN, retries=0)
        for job in ("a", "b"):
            up.register(job, f"agent-{job}", "n", workers([0], 1))
        first, joined = up.create_trigger("a", "t", window_s=0.1)
        assert not joined
        time.sleep(0.15)
        assert not up.create_trigger("a", "t", window_s=1.0)[1]  # the second: at the cap, accepted
        assert up.create_trigger("a", "t")[1]  # joining an open session is always accepted
        time.sleep(1.05)  # its window is over: the next trigger would open a third session
        for _ in range(6):  # past the cap: refused, with the reason
            status, answer = _post(svc.url, "/v1/jobs/a/triggers", {"reason": "t", "window_s": 0.1})
            assert status == 429 and "max-open-sessions 2" in answer["error"]
        assert not up.create_trigger("b", "t")[1]  # another job is not starved
        svc.service.sessions.localize_now(first)  # one closes: a new one may open
        time.sleep(0.05)
        assert len([s for s in svc.store.sessions(job="a") if s.state == "open"]) == 1


def test_triggers_per_minute_are_limited_per_job_token(tmp_path: Path) -> None:
    scoped = "scoped-token-0123456789abcdef"
    opts = ServiceOptions(job_tokens={scoped: ("t-*",)},
                          sessions=SessionOptions(join_slack_s=0.0, max_open_sessions_per_job=0, triggers_per_minute=3,
                                                  hang_collect_s=0.01))
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        admin, tenant = Uplink(svc.url, TOKEN, retries=0), Uplink(svc.url, scoped, retries=0)
        for i in range(4):
            admin.register(f"t-{i}", f"agent-{i}", "n", workers([0], 1))
        opened = []
        for i in range(3):  # up to the limit: accepted (one job token, three of its jobs)
            session, joined = tenant.create_trigger(f"t-{i}", "t", window_s=30)
            opened.append(session)
            assert not joined
        assert tenant.create_trigger("t-2", "t")[1]  # a join is free
        refused = 0
        for i in range(20):  # the fourth session (just past the limit), and far past it
            status, answer = _post(svc.url, f"/v1/jobs/t-{i % 4}/triggers", {"reason": "t"}, scoped)
            if i % 4 == 3:  # t-3 has no open session: its trigger would open a fourth
                assert status == 429 and "triggers-per-minute 3" in answer["error"] and "retry in" in answer["error"]
                refused += 1
            else:  # the others join their open sessions, which costs nothing
                assert status == 200 and answer["joined"]
        assert refused == 5
        assert not admin.create_trigger("t-3", "t")[1]  # the main token's triggers count per job: t-3 is fresh


def test_limits_and_retention_from_the_command_line(tmp_path: Path) -> None:
    store = tmp_path / "s.sqlite"
    now = time.time_ns()
    _seed(store, tmp_path / "reports", now, [("old", 40 * DAY_S, "done"), ("new", 0.0, "done"),
                                             ("open-old", 40 * DAY_S, "open")])
    proc = LocalizerProcess(tmp_path, store, extra=["--max-open-sessions", "1", "--triggers-per-minute", "50",
                                                     "--retention-days", "30", "--retention-max-mb", "100",
                                                     "--report-dir", str(tmp_path / "reports")])
    try:
        up = Uplink(proc.start(), TOKEN, retries=0)
        end = time.monotonic() + 20
        while time.monotonic() < end and (tmp_path / "reports" / "old.json").exists():
            time.sleep(0.1)
        listed = {s["session"] for s in up.list_sessions()}
        assert listed == {"new", "open-old"} and not (tmp_path / "reports" / "old.json").exists()
        assert (tmp_path / "reports" / "new.json").exists()
        up.register("c", "agent-c", "n", workers([0], 1))
        up.create_trigger("c", "t", window_s=0.1)
        time.sleep(2.2)  # past the window and the default join slack (2 s): the next would open a second
        assert _post(up.url, "/v1/jobs/c/triggers", {"reason": "t", "window_s": 0.1})[0] == 429
    finally:
        proc.stop()


# ---------------------------------------------------------------- retention
def _seed(store_path: Path, reports: Path, now: int, rows: list[tuple[str, float, str]],
          body_bytes: int = 10_000) -> None:
    store = Store(store_path)
    reports.mkdir(exist_ok=True)
    for name, age_s, state in rows:
        t = now - int(age_s * 1e9)
        store.insert_session(SessionRecord(0, name, "job", "slowdown", "r", 20.0, state, t, t, closed_ns=t if state != "open" else 0,
                                           expected=RankRanges.span(2)))
        if state == "done":
            report = Report(job="job", session=name, kind="slowdown", created_ns=t, trigger_reason="r", window_s=20.0,
                            ranks_reported=(0, 1), summary="x" * body_bytes)
            store.events.put_report(report)
            (reports / f"{name}.json").write_text("y" * body_bytes)
    store.close()


def test_retention_by_age_and_by_total_size(tmp_path: Path) -> None:
    now = time.time_ns()
    reports = tmp_path / "reports"
    rows = [("s-aged", 31 * DAY_S, "done"), ("s-failed-aged", 45 * DAY_S, "failed"),
            ("s-almost", 29.9 * DAY_S, "done"), ("s-open", 90 * DAY_S, "open")]
    rows += [(f"s-{i:02d}", (20 - i) * 60.0, "done") for i in range(20)]  # 20 reports of ~20 kB, oldest first
    _seed(tmp_path / "s.sqlite", reports, now, rows)
    (reports / "orphan.json").write_text("z")
    old = (now - int(31 * DAY_S * 1e9)) / 1e9
    import os

    os.utime(reports / "orphan.json", (old, old))
    (reports / "recent-orphan.json").write_text("z")
    store = Store(tmp_path / "s.sqlite")
    r = Retention(store, reports, RetentionOptions(max_age_s=30 * DAY_S, max_bytes=12 * 20_500))
    plan = r.sweep(now)
    assert set(plan.expired) == {"s-aged", "s-failed-aged"}  # past 30 days; 29.9 days is kept
    kept = {s.session for s in store.sessions()}
    assert "s-open" in kept  # an open session is never deleted, however old
    assert plan.kept_bytes <= 12 * 20_500 and plan.evicted[0] == "s-almost"  # then the oldest closed ones
    assert plan.evicted == ("s-almost", *(f"s-{i:02d}" for i in range(len(plan.evicted) - 1)))  # oldest first
    assert 0 < len(plan.evicted) < 20
    assert {f"s-{i:02d}" for i in range(20)} - kept == set(plan.evicted) - {"s-almost"}
    assert "s-19" in kept and store.events.get_report("s-19") is not None  # the newest stay
    for s in plan.sessions:
        assert store.events.get_report(s) is None and not (reports / f"{s}.json").exists()
    assert not (reports / "orphan.json").exists() and (reports / "recent-orphan.json").exists()
    assert r.sweep(now).sessions == ()  # under both bounds now: nothing more
    off = Retention(store, reports, RetentionOptions(max_age_s=0, max_bytes=0)).sweep(now + int(400 * DAY_S * 1e9))
    assert off.sessions == ()  # 0 turns both bounds off
    store.close()


def test_the_service_sweeps_off_the_event_loop(tmp_path: Path) -> None:
    now = time.time_ns()
    _seed(tmp_path / "s.sqlite", tmp_path / "reports", now, [(f"x-{i}", 40 * DAY_S, "done") for i in range(450)])
    opts = ServiceOptions(report_dir=str(tmp_path / "reports"),
                          retention=RetentionOptions(interval_s=3600, chunk=100))
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        end = time.monotonic() + 30
        reports = tmp_path / "reports"
        while (svc.store.sessions(limit=1) or any(reports.iterdir())) and time.monotonic() < end:  # in chunks
            assert Uplink(svc.url, TOKEN).request("GET", "/v1/healthz", timeout_s=2)[0] == 200
            time.sleep(0.05)
        assert svc.store.sessions() == [] and list(reports.iterdir()) == []
        assert _run(svc, svc.service.sweep()).sessions == ()


def test_retention_settings_from_the_environment() -> None:
    from perftracker.errors import ConfigError

    got = RetentionOptions.from_env({"PERFTRACKER_RETENTION_DAYS": "7", "PERFTRACKER_RETENTION_MAX_MB": "256"})
    assert got.max_age_s == 7 * DAY_S and got.max_bytes == 256 * 2**20
    assert RetentionOptions.from_env({}) == RetentionOptions()
    for bad in ("-1", "nan", "inf", "x"):
        with pytest.raises(ConfigError, match="PERFTRACKER_RETENTION_DAYS"):
            RetentionOptions.from_env({"PERFTRACKER_RETENTION_DAYS": bad})


def test_a_hang_session_of_a_claimed_world_diagnoses_what_was_heard(tmp_path: Path) -> None:
    """One rank registered with world_size 10,000,000 reports a hang: the session expects 1,000,000
    ranks; the diagnosis looks at the ranks heard from and ~1,000 silent ones, the others are only
    listed as missing (before: a million SilentRanks, ~1 GB and a 150 MB report)."""
    opts = ServiceOptions(sessions=SessionOptions(hang_collect_s=0.3))
    with ServiceThread(tmp_path / "s.sqlite", opts) as svc:
        up = Uplink(svc.url, TOKEN, retries=0)
        up.register("hw", "agent-hw", "n", workers([0], 10_000_000))
        snap = HangSnapshot("hw", 0, 2, "n", 100, time.time_ns(), 41, 300.0, (Frame("dist.py", 10, "all_reduce"),),
                            current_op="c10d::allreduce_")
        session = up.upload_hang_snapshot(snap)["session"]
        end = time.monotonic() + 60
        while (report := up.get_report(session)) is None and time.monotonic() < end:
            time.sleep(0.2)
        assert report is not None and report.kind == "hang"
        assert len(report.ranks_missing) == 999_999 and report.ranks_missing[:2] == (1, 2)
        assert len(report.hang_states) <= 1 + 1024 and "998975 more expected rank(s)" in report.summary  # said once
        assert len(json.dumps(svc.store.events.get_report_dict(session))) < 12 * 2**20
