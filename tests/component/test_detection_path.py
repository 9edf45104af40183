"""A detection from the agent's uplink to the report (issue 48), over a real `perftracker
localizer` subprocess: the typed detection the agent builds from a worker's TRIGGER goes with the
trigger request, is kept with the session (sqlite) and comes back in the report's ``trigger``; a
trigger without one (the CLI's) has none; a malformed one is a clear 400."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from perftracker.agent.daemon.localizer_client import Uplink, UplinkError
from perftracker.agent.daemon.localizer_link import describe_trigger

from perftracker.model.trigger import Detection
from tests.service_helpers import TOKEN, LocalizerProcess, workers

DETAIL = {"source": "detector", "test": "cusum", "ratio": 1.49, "baseline_ms": 42.9, "recent_ms": 63.9,
          "noise": 0.02, "iteration": 268, "rank": 2}


@pytest.fixture(scope="module")
def localizer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalizerProcess]:
    tmp = tmp_path_factory.mktemp("loc")
    proc = LocalizerProcess(tmp, tmp / "store.sqlite", extra=["--window-s", "0.3", "--collect-grace-s", "0.5"])
    proc.start()
    yield proc
    proc.stop()


def _closed(up: Uplink, session: str, timeout_s: float = 20.0) -> dict:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        s = up.get_session(session)
        if s["state"] in ("done", "failed"):
            return s
        time.sleep(0.1)
    raise AssertionError(f"session {session} did not close")


def test_the_detection_is_kept_with_the_session_and_carried_in_the_report(localizer: LocalizerProcess) -> None:
    up = Uplink(localizer.url, TOKEN)
    up.register("job-d", "agent-0", "node0", workers(range(4), 4))
    detection = Detection.from_detail(2, "slowdown", DETAIL)  # what forward_trigger builds
    assert describe_trigger(2, "slowdown", DETAIL) == detection.reason_text()
    session, joined = up.create_trigger("job-d", detection.reason_text(), 0.3, detection.to_dict())
    assert not joined
    s = _closed(up, session)  # nobody uploads: partial at the deadline
    assert s["reason"] == "rank 2: slowdown at iteration 268 (+49% over 42.9 ms)"
    assert Detection.from_dict(s["detection"]) == detection
    report = up.get_report(session)
    assert report is not None and report.trigger == detection
    from perftracker.localizer.render.facts import baseline_ms, trigger_text

    assert trigger_text(report) == "slowdown at iteration 268 (+49% over 42.9 ms), detected on rank 2"
    assert baseline_ms(report) == 42.9


def test_a_trigger_without_one_has_none_and_a_bad_one_is_refused(localizer: LocalizerProcess) -> None:
    up = Uplink(localizer.url, TOKEN)
    up.register("job-e", "agent-0", "node0", workers(range(2), 2))
    session, _ = up.create_trigger("job-e", "cli", window_s=0.3)
    _closed(up, session)
    report = up.get_report(session)
    assert report is not None and report.trigger is None and report.trigger_reason == "cli"
    bad = {**Detection.from_detail(0, "slowdown", DETAIL).to_dict(), "rank": "two"}
    with pytest.raises(UplinkError) as e:
        up.create_trigger("job-f", "rank 0: slowdown", 0.3, bad)
    assert e.value.status == 400 and "detection.rank" in str(e.value)


def test_a_store_from_before_the_detection_column_gains_it_and_keeps_its_sessions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import dataclasses
    import sqlite3

    from perftracker.localizer.store.sqlite_store import SessionRecord, Store

    path = tmp_path / "s.sqlite"
    old = SessionRecord(seq=0, session="s-old", job="j", kind="slowdown", reason="rank 0: slowdown", window_s=2.0,
                        state="open", opened_ns=10, deadline_ns=20, expected=(0, 1))
    store = Store(path)
    store.insert_session(old)
    store.close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE sessions DROP COLUMN detection")  # the table as a store of before issue 48 has it
    db.commit()
    db.close()
    store = Store(path)
    try:
        got = store.get_session("s-old")
        assert got is not None and got.detection is None and got.reason == "rank 0: slowdown"
        new = dataclasses.replace(old, session="s-new", detection=Detection.from_detail(0, "slowdown", DETAIL))
        store.insert_session(new)
        back = store.get_session("s-new")
        assert back is not None and back.detection == new.detection
    finally:
        store.close()
