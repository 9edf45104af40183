"""Prometheus metrics: the agent's collectors (each iteration observed once, in seconds; counters
ending in _total), the localizer's /metrics over a real `perftracker localizer` process, and
`promtool check metrics` on both expositions where promtool is installed (Debian: prometheus)."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agent.metrics import Metrics, MetricsServer
from agent.uplink import Uplink
from tests.service_helpers import TOKEN, LocalizerProcess, make_pattern_set, workers

PROMTOOL = shutil.which("promtool")


def promtool_check(text: bytes) -> str:
    """`promtool check metrics` (lint: names, units, _total, HELP); its output, asserting exit 0."""
    if PROMTOOL is None:
        pytest.skip("promtool not on PATH (apt-get install prometheus; .ci/run installs it)")
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=60)
    out = (proc.stdout + proc.stderr).decode()
    assert proc.returncode == 0, out
    return out


def sample(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {line_start!r} in:\n{text}")


def test_agent_iteration_histogram_counts_each_iteration_once_in_seconds() -> None:
    m = Metrics()
    assert m.enabled
    # ITER_STATS carries the last N durations up to `iteration`; consecutive messages overlap
    assert m.iteration_times("j", 0, 10, [100.0, 100.0, 100.0]) == 3
    assert m.iteration_times("j", 0, 12, [100.0, 100.0, 300.0, 3000.0]) == 2  # only 300 and 3000 are new
    assert m.iteration_times("j", 0, 12, [100.0, 300.0, 3000.0]) == 0  # nothing new
    assert m.iteration_times("j", 0, 2, [50.0, 50.0]) == 2  # the worker restarted: all new
    m.heartbeat("j", 0, 10, "watching")
    m.heartbeat("j", 0, 25, "profiling")
    m.heartbeat("j", 0, 3, "profiling")  # restarted: 3 more iterations
    text = m.render().decode()
    assert sample(text, 'perftracker_iteration_duration_seconds_count{job="j",rank="0"}') == 7
    assert sample(text, 'perftracker_iteration_duration_seconds_sum{job="j",rank="0"}') == pytest.approx(3.7)
    assert sample(text, 'perftracker_iteration_duration_seconds_bucket{job="j",le="0.1",rank="0"}') == 5
    assert sample(text, 'perftracker_iteration_duration_seconds_bucket{job="j",le="0.25",rank="0"}') == 5
    assert sample(text, 'perftracker_iteration_duration_seconds_bucket{job="j",le="0.5",rank="0"}') == 6
    assert sample(text, 'perftracker_iterations_total{job="j",rank="0"}') == 28
    assert sample(text, 'perftracker_detector_phase{job="j",phase="profiling",rank="0"}') == 1
    assert 'phase="watching"' not in text  # the old phase's series is gone
    for name in ("perftracker_iterations", "perftracker_sessions", "perftracker_triggers", "perftracker_uploads"):
        assert f"# TYPE {name}_total counter" in text or f"# TYPE {name} counter" in text
    assert "_ms" not in text


def test_agent_metrics_server_and_promtool() -> None:
    m = Metrics()
    m.workers("j", 2)
    m.iteration_times("j", 1, 5, [20.0, 21.0])
    m.heartbeat("j", 1, 5, "watching")
    m.trigger("j")
    m.session("started")
    m.upload("patterns", ok=True)
    m.upload("patterns", ok=False)
    m.summarized(1.5)
    m.tick()
    server = MetricsServer(m, "127.0.0.1", 0, stale_after_s=0.5)
    try:
        with urllib.request.urlopen(server.url, timeout=5) as resp:
            body = resp.read()
            assert resp.headers["Content-Type"].startswith("text/plain; version=")
        text = body.decode()
        assert sample(text, 'perftracker_uploads_total{kind="patterns",result="error"}') == 1
        assert sample(text, "perftracker_summarize_duration_seconds_count") == 1
        health = server.url.replace("/metrics", "/healthz")
        assert urllib.request.urlopen(health, timeout=5).status == 200
        time.sleep(0.7)  # no tick: the event loop looks stalled
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(health, timeout=5)
        assert err.value.code == 503
    finally:
        server.close()
    out = promtool_check(body)
    print(f"promtool check metrics (agent): exit 0, output {out.strip()!r}")


def test_promtool_fails_on_a_badly_named_metric() -> None:
    """The promtool check can fail: a counter without _total and a unit in milliseconds."""
    if PROMTOOL is None:
        pytest.skip("promtool not on PATH")
    bad = b"# HELP perftracker_iteration_ms Iteration time.\n# TYPE perftracker_iteration_ms counter\n" \
          b"perftracker_iteration_ms 3\n"
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=bad, capture_output=True, timeout=60)
    assert proc.returncode != 0 and b"_total" in proc.stdout + proc.stderr


def test_localizer_metrics_endpoint(tmp_path: Path) -> None:
    loc = LocalizerProcess(tmp_path, tmp_path / "store.sqlite", extra=["--window-s", "0.5", "--collect-grace-s", "1.5"])
    loc.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:  # the token, like every path but /v1/healthz
            urllib.request.urlopen(loc.url + "/metrics", timeout=5)
        assert err.value.code == 401
        up = Uplink(loc.url, TOKEN)
        up.register("job-m", "agent-0", "node0", workers(range(4), 4))
        session, _ = up.create_trigger("job-m", "metrics test", window_s=0.5)
        for r in range(4):
            up.upload_patterns(make_pattern_set("job-m", session, r, 4, slow=(r == 2), seed=3))
        end = time.monotonic() + 30
        while up.get_session(session)["state"] not in ("done", "failed") and time.monotonic() < end:
            time.sleep(0.1)
        report = up.get_report(session)
        req = urllib.request.Request(loc.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        text = body.decode()
    finally:
        loc.stop()
    assert sample(text, 'perftracker_localizer_sessions{kind="slowdown",state="done"}') == 1
    assert sample(text, 'perftracker_localizer_sessions{kind="slowdown",state="failed"}') == 0
    assert sample(text, 'perftracker_localizer_upload_duration_seconds_count{kind="patterns",result="ok"}') == 4
    assert sample(text, f'perftracker_localizer_reports_total{{kind="slowdown",status="{report.status}"}}') == 1
    by_category: dict[str, int] = {}
    for f in report.findings:
        by_category[f.category.value] = by_category.get(f.category.value, 0) + 1
    assert by_category, "the slow rank gives findings"
    for category, n in by_category.items():
        assert sample(text, f'perftracker_localizer_findings_total{{category="{category}"}}') == n
    out = promtool_check(body)
    print(f"promtool check metrics (localizer): exit 0, output {out.strip()!r}")
