"""The localizer store: real sqlite in WAL mode, schema_version on every row, durable writes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from perftracker.localizer.store.sqlite_store import (
    HeartbeatRecord,
    SessionRecord,
    Store,
    StoreError,
    WorkerRecord,
)

from perftracker.errors import SchemaError
from perftracker.model import REPORT_SCHEMA_VERSION, Frame, HangSnapshot, Report
from tests.service_helpers import make_pattern_set


def _session(name: str = "s1", job: str = "j") -> SessionRecord:
    return SessionRecord(seq=0, session=name, job=job, kind="slowdown", reason="test", window_s=2.0, state="open",
                         opened_ns=10, deadline_ns=20, expected=(0, 1))


def test_wal_mode_and_schema_version_on_every_table(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.close()
    db = sqlite3.connect(tmp_path / "s.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                       "AND name NOT IN ('meta', 'sqlite_sequence')")]
    assert set(tables) == {"agents", "workers", "sessions", "patterns", "pattern_batches", "hang_snapshots",
                           "heartbeats", "reports", "baselines", "culprits"}  # the last two: issue 49
    for t in tables:
        cols = [r[1] for r in db.execute(f"PRAGMA table_info({t})")]
        assert "schema_version" in cols, t


def test_everything_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    store = Store(path)
    store.register("j", "agent-a", "h", [WorkerRecord("j", 0, "agent-a", 0, 2, 11, 12, "h")], now_ns=5)
    rec = store.insert_session(_session())
    assert rec.seq == 1
    ps = make_pattern_set("j", "s1", 0, 2)
    store.put_patterns(ps, now_ns=7)
    snap = HangSnapshot("j", 1, 2, "h", 99, 123, 4, 7.5, (Frame("a.py", 3, "f"),), session="s1")
    store.put_hang_snapshot(snap, "s1", now_ns=8)
    store.put_heartbeats([HeartbeatRecord("j", 0, "agent-a", 40, "steady", 0.5, True, 101.0, 9)])
    report = Report(job="j", session="s1", kind="slowdown", created_ns=1, trigger_reason="test", window_s=2.0,
                    ranks_reported=(0,), ranks_missing=(1,), status="partial", summary="x")
    store.put_report(report)
    store.close()  # a fresh handle, as after a restart

    again = Store(path)
    assert [w.rank for w in again.workers("j")] == [0]
    assert again.jobs() == ["j"]
    s = again.get_session("s1")
    assert s is not None and s.expected == (0, 1) and s.uploaded == (0, 1) and s.missing == ()
    assert [p.to_dict() for p in again.pattern_sets("s1")] == [ps.to_dict()]
    assert again.hang_snapshots("s1") == [snap]
    assert again.heartbeats("j")[0].iteration == 40
    assert again.get_report("s1") == report
    assert again.get_report_dict("s1")["schema_version"] == REPORT_SCHEMA_VERSION  # the report's own version


def test_repeat_upload_replaces_and_latest_snapshot_wins(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.insert_session(_session())
    store.put_patterns(make_pattern_set("j", "s1", 0, 2, seed=1), 1)
    newer = make_pattern_set("j", "s1", 0, 2, seed=2)
    store.put_patterns(newer, 2)
    assert [p.to_dict() for p in store.pattern_sets("s1")] == [newer.to_dict()]
    for i in range(3):
        store.put_hang_snapshot(HangSnapshot("j", 0, 2, "h", 1, i, i, 1.0, ()), "s1", i)
    assert [s.taken_ns for s in store.hang_snapshots("s1")] == [2]


def test_sessions_filter_by_job_state_and_seq(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    a = store.insert_session(_session("a", "j1"))
    store.insert_session(_session("b", "j2"))
    store.insert_session(_session("c", "j1"))
    store.update_session("c", state="done", closed_ns=5)
    assert [s.session for s in store.sessions(job="j1")] == ["a", "c"]
    assert [s.session for s in store.sessions(job="j1", states=("open",))] == ["a"]
    assert [s.session for s in store.sessions(after_seq=a.seq)] == ["b", "c"]
    with pytest.raises(ValueError):
        store.update_session("a", job="other")


def test_wrong_store_version_and_garbage_file_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(SchemaError, match="schema_version 99"):
        Store(path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="junk.sqlite"):
        Store(junk)


def test_write_is_visible_to_another_connection_immediately(tmp_path: Path) -> None:
    """Committed before the call returns: a second process-like connection sees it."""
    path = tmp_path / "s.sqlite"
    store = Store(path)
    store.insert_session(_session())
    store.put_patterns(make_pattern_set("j", "s1", 1, 2), 3)
    other = sqlite3.connect(path)
    assert other.execute("SELECT rank FROM patterns WHERE session='s1'").fetchall() == [(1,)]


def test_run_batch_commits_together_and_isolates_a_failing_writer(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.insert_session(_session())

    def bad() -> None:
        store.put_patterns(make_pattern_set("j", "s1", 5, 6), 1)  # written, then rolled back alone
        raise RuntimeError("boom")

    results = store.run_batch([lambda: store.put_patterns(make_pattern_set("j", "s1", 0, 2), 1), bad,
                               lambda: store.put_patterns(make_pattern_set("j", "s1", 1, 2), 1) or "ok"])
    assert [ok for ok, _ in results] == [True, False, True] and results[2][1] == "ok"
    assert isinstance(results[1][1], RuntimeError)
    assert store.pattern_ranks("s1") == [0, 1]
