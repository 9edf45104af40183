"""Offline reports (Kineto traces, no hardware samples) say what they lack: kind offline, per-rank
step times, and no μ/σ rows or claims; impact is shown with every finding."""

from __future__ import annotations

import dataclasses
import io

import pytest
from perftracker.localizer.diagnose.localize import localize
from perftracker.localizer.diagnose.method.options import LocalizeOptions
from perftracker.localizer.render import html, text

from perftracker.cli.analyze import summarize_dir
from perftracker.model import Report
from tests.conftest import DLRM_DIR


@pytest.fixture(scope="module")
def dlrm_report() -> Report:
    if not DLRM_DIR.is_dir():
        pytest.fail(f"dlrm reference traces missing: {DLRM_DIR} (set PERFTRACKER_DLRM_DIR)")
    return localize(summarize_dir(DLRM_DIR, jobs=2).sets, LocalizeOptions(created_ns=1))


def test_offline_report_text_has_step_times_and_no_utilization_rows(dlrm_report: Report) -> None:
    assert dlrm_report.kind == "offline"
    buf = io.StringIO()
    text.render(dlrm_report, buf, color=False, width=200)
    out = buf.getvalue()
    assert "step time" in out and "1: 19.9 ms" in out and "7: 12.5 ms" in out
    assert "offline (complete)" in out and "(offline, " not in out  # the session is its kind: said once
    assert "μ utilization" not in out and "σ util" not in out
    assert "impact" in out and "utilization" not in dlrm_report.findings[0].sentence


def test_offline_report_html_has_step_times_and_no_utilization_rows(dlrm_report: Report) -> None:
    buf = io.StringIO()
    html.render(dlrm_report, buf)
    out = buf.getvalue()
    assert "<dt>step time</dt>" in out and "\u03bc utilization" not in out and "<svg" in out
    assert "impact " in out


def test_online_report_keeps_utilization_rows(dlrm_report: Report) -> None:
    # a version 1 finding (no evidence lines) is shown with its pattern table
    v1 = tuple(dataclasses.replace(f, title="", evidence=(), next_steps=()) for f in dlrm_report.findings)
    online = dataclasses.replace(dlrm_report, kind="slowdown", findings=v1)
    buf = io.StringIO()
    text.render(online, buf, color=False, width=200)
    assert "μ utilization" in buf.getvalue() and "step time" not in buf.getvalue()


def test_step_times_equal_within_one_percent_read_as_one_time_and_its_twin_lists_each_rank(dlrm_report: Report) -> None:
    from perftracker.localizer.render.facts import step_times_text
    same = dataclasses.replace(dlrm_report, iteration_ms={0: (16.5,), 1: (16.6,), 2: (16.52,)})  # 0.6% apart
    assert step_times_text(same) == "16.5 ms on every rank (ranks that finish early wait for the others)"
    apart = dataclasses.replace(dlrm_report, iteration_ms={0: (16.5,), 1: (16.8,), 2: (16.52,)})  # 1.8% apart
    assert step_times_text(apart) == "0: 16.5 ms, 1: 16.8 ms, 2: 16.5 ms"
