"""The typed detection (perftracker/model/trigger.py, issue 48): read once from the detector's
detail, versioned JSON, formatted for the session's reason and the report; never parsed back."""

from __future__ import annotations

import json

import pytest

from perftracker.errors import SchemaError
from perftracker.model import Report
from perftracker.model.trigger import DETECTOR, MANUAL, Detection

CUSUM = {"source": "detector", "rule": "robust", "test": "cusum", "ratio": 1.18, "baseline_ms": 45.1,
         "recent_ms": 53.2, "noise": 0.031, "iteration": 312, "mode": "robust", "rank": 2, "job": "j"}


def test_a_detectors_detail_is_read_once_into_fields() -> None:
    d = Detection.from_detail(2, "slowdown", CUSUM)
    assert (d.rank, d.source, d.test, d.iteration) == (2, DETECTOR, "cusum", 312)
    assert (d.baseline_ms, d.slow_ms, d.ratio, d.noise) == (45.1, 53.2, 1.18, 0.031)
    assert d.reason_text() == "rank 2: slowdown at iteration 312 (+18% over 45.1 ms)"
    assert d.text() == "slowdown at iteration 312 (+18% over 45.1 ms), detected on rank 2"
    # the paper rule's keys (shortest_ms, mean_ms) are the same fields
    paper = Detection.from_detail(0, "slowdown", {"rule": "paper", "ratio": 2.06, "shortest_ms": 101.0,
                                                  "mean_ms": 208.0, "iteration": 850})
    assert (paper.test, paper.baseline_ms, paper.slow_ms) == ("paper", 101.0, 208.0)
    # a held detection that went out late says so
    late = Detection.from_detail(1, "slowdown", {**CUSUM, "deferred_s": 42.5, "ratio_when_sent": 1.21})
    assert (late.deferred_s, late.ratio_when_sent) == (42.5, 1.21)


def test_what_is_not_a_number_stays_unknown() -> None:
    d = Detection.from_detail(3, "manual", {"source": "manual", "iteration": True, "ratio": "1.5",
                                            "baseline_ms": float("nan"), "recent_ms": -1.0})
    assert d.source == MANUAL and d.iteration is None and d.ratio is None
    assert d.baseline_ms is None and d.slow_ms is None
    assert d.sentence() == "manual"  # no iteration, no ratio: nothing invented
    assert Detection.from_detail(0, "slowdown", {"source": "elsewhere"}).source == DETECTOR


def test_json_round_trips_and_bad_json_is_a_schema_error() -> None:
    d = Detection.from_detail(2, "slowdown", CUSUM)
    assert Detection.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    assert "noise" not in Detection.from_detail(0, "slowdown", {}).to_dict()  # unknowns are left out
    for bad, field in (({**d.to_dict(), "rank": True}, "rank"), ({**d.to_dict(), "ratio": "x"}, "ratio"),
                       ({**d.to_dict(), "schema_version": 99}, "schema_version")):
        with pytest.raises(SchemaError, match=field):
            Detection.from_dict(bad)
    no_rank = d.to_dict()
    del no_rank["rank"]
    with pytest.raises(SchemaError, match="rank"):
        Detection.from_dict(no_rank)


def test_a_report_carries_it_and_leaves_it_out_when_there_is_none() -> None:
    base = Report(job="j", session="s", kind="slowdown", created_ns=1, trigger_reason="rank 2: slowdown",
                  window_s=5.0, ranks_reported=(0, 1, 2))
    assert "trigger" not in base.to_dict()  # offline traces, hangs, crashes, manual: unchanged JSON
    d = Detection.from_detail(2, "slowdown", CUSUM)
    with_it = Report.from_dict(json.loads(json.dumps({**base.to_dict(), "trigger": d.to_dict()})))
    assert with_it.trigger == d and Report.from_dict(base.to_dict()).trigger is None


def test_the_worker_sends_it_typed_and_the_agent_checks_it() -> None:
    from perftracker.agent.daemon.workers import BadWorkerMessage, check_worker_message

    from perftracker.runtime.channel_messages import trigger_message

    msg = trigger_message("slowdown", {**CUSUM, "obj": object()})
    assert Detection.from_dict(msg["detection"]) == Detection.from_detail(2, "slowdown", CUSUM)
    check_worker_message(msg)
    check_worker_message({k: v for k, v in msg.items() if k != "detection"})  # a worker of before issue 48
    with pytest.raises(BadWorkerMessage, match="detection.ratio"):
        check_worker_message({**msg, "detection": {**msg["detection"], "ratio": "fast"}})
