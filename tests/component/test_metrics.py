"""Prometheus metrics: the agent's collectors (each iteration observed once, in seconds; counters
ending in _total), the localizer's /metrics over a real `perftracker localizer` process, and
`promtool check metrics` on both expositions where promtool is installed (Debian: prometheus)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from perftracker.agent.daemon.agent_metrics import Metrics, MetricsServer
from perftracker.agent.daemon.localizer_client import Uplink

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


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')


def sample(text: str, series: str) -> float:
    """The value of ``series`` (``name{a="x",b="y"}``, labels in any order) in an exposition."""
    want = _SAMPLE.match(series + " 0")
    assert want, series
    key = (want.group(1), frozenset(re.findall(r'(\w+)="([^"]*)"', want.group(2) or "")))
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and (m.group(1), frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))) == key:
            return float(m.group(3))
    raise AssertionError(f"no sample {series!r} in:\n{text}")


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
    assert sample(text, 'perftracker_iteration_duration_seconds_count{training_job="j",rank="0"}') == 7
    assert sample(text, 'perftracker_iteration_duration_seconds_sum{training_job="j",rank="0"}') == pytest.approx(3.7)
    assert sample(text, 'perftracker_iteration_duration_seconds_bucket{training_job="j",le="0.1",rank="0"}') == 5
    assert sample(text, 'perftracker_iteration_duration_seconds_bucket{training_job="j",le="0.25",rank="0"}') == 5
    assert sample(text, 'perftracker_iteration_duration_seconds_bucket{training_job="j",le="0.5",rank="0"}') == 6
    assert sample(text, 'perftracker_iterations_total{training_job="j",rank="0"}') == 28
    assert sample(text, 'perftracker_detector_phase{training_job="j",phase="profiling",rank="0"}') == 1
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
        up.register("job-m", "perftracker.agent-0", "node0", workers(range(4), 4))
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


def _exposed_names() -> set[str]:
    """Every sample name the agent and the localizer expose (all label sets populated)."""
    from perftracker.localizer.service.service_metrics import LocalizerMetrics

    m = Metrics()
    m.workers("j", 1)
    m.iteration_times("j", 0, 1, [10.0])
    m.heartbeat("j", 0, 1, "watching")
    m.trigger("j")
    m.session("started")
    m.upload("patterns", ok=True)
    m.summarized(1.0)
    loc = LocalizerMetrics(lambda: {("done", "slowdown"): 1})
    loc.reports.labels("slowdown", "complete").inc()
    loc.findings.labels("compute").inc()
    loc.upload_s.labels("patterns", "ok").observe(0.1)
    text = m.render().decode() + loc.exposition().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_grafana_dashboard_queries_exposed_metrics_and_parse() -> None:
    """Every metric a panel queries is one we expose; every query is valid PromQL (promtool check
    rules, with Grafana's $variables substituted)."""
    import json

    dash = json.loads((Path(__file__).resolve().parents[2] / "k8s/monitoring/grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    names = _exposed_names()
    for expr in exprs:
        used = set(re.findall(r"\bperftracker_[a-z_]+", expr))
        assert used and used <= names, f"{expr}: {used - names} not exposed"
    def family(name: str) -> str:
        return re.sub(r"_(bucket|sum|count|created|total)$", "", name)

    families = {family(n) for n in names}
    queried = {family(n) for e in exprs for n in re.findall(r"\bperftracker_[a-z_]+", e)}
    assert families - queried == set(), "every metric has a panel"
    if PROMTOOL is None:
        pytest.skip("promtool not on PATH: PromQL syntax not checked")
    import yaml

    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"perftracker:panel_{i}",
         "expr": e.replace("$__rate_interval", "5m").replace('"$training_job"', '".*"')} for i, e in enumerate(exprs)]}]}
    path = Path(__file__).parent / ".dashboard-rules.tmp.yaml"
    try:
        path.write_text(yaml.safe_dump(rules))
        proc = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    finally:
        path.unlink(missing_ok=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
