"""Hosts that keep being the culprit (issue 49): recorded as reports are stored, flagged only after
several sessions, exported on /metrics and listed by `perftracker hosts`. Real sqlite, real CLI process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from perftracker.localizer.service.service_metrics import LocalizerMetrics
from perftracker.localizer.service.session.manager import SessionManager, SessionOptions
from perftracker.localizer.service.validate import Registration, WorkerInfo
from perftracker.localizer.store.sqlite_store import Store

from perftracker.clock import FakeClock
from perftracker.model import Box, Category, Finding, RankState, Report, Triple

T0 = 1_700_000_000 * 10**9
DAY_NS = 86400 * 10**9
T = Triple(0.3, 0.8, 0.1)


def _finding(ranks: tuple[int, ...], kind: str = "specific", cause: str = "slow_compute") -> Finding:
    return Finding(key="forward", label="forward", category=Category.COMPUTE, ranks=ranks, kind=kind,
                   tests=("differential",), observed=T, median=T, expected=Box(T, T), sentence="s", cause=cause)


def _mgr(path: Path, job: str, clock: FakeClock) -> SessionManager:
    m = SessionManager(Store(path), clock, SessionOptions(default_window_s=2.0))
    m.register(Registration(job, "a", "h", tuple(WorkerInfo(r, r, 4, 100 + r, 100 + r, f"node{r // 2}")
                                                 for r in range(4))))
    return m


def _report(m: SessionManager, job: str, findings: tuple[Finding, ...] = (), hang: tuple[RankState, ...] = ()) -> None:
    s, _ = m.trigger(job, "on-demand (perftracker trigger)")
    assert m.begin_localizing(s.session) is not None
    rep = Report(job=job, session=s.session, kind="hang" if hang else "slowdown", created_ns=0, trigger_reason="x",
                 window_s=2.0, ranks_reported=(0, 1, 2, 3), findings=findings, hang_states=hang)
    assert m.finish(s.session, rep)
    assert isinstance(m.clock, FakeClock)
    m.clock.advance_s(60.0)


def test_one_report_does_not_flag_a_host_three_sessions_across_jobs_do(tmp_path: Path) -> None:
    path = tmp_path / "localizer.sqlite"
    clock = FakeClock(T0)
    a = _mgr(path, "jobA", clock)
    _report(a, "jobA", (_finding((3,)), _finding((0, 1, 2, 3), kind="common")))  # the job-wide one blames no host
    hosts = a.store.culprits.hosts(clock.now_ns())
    assert [(h.host, h.sessions, h.flagged) for h in hosts] == [("node1", 1, False)]
    _report(a, "jobA")  # a clean report: nothing
    _report(a, "jobA", (_finding((2,), cause="host_bound"),))
    b = _mgr(path, "jobB", clock)  # another job on the same hosts
    _report(b, "jobB", hang=(RankState(3, "culprit", "train.py:88"), RankState(0, "waiting", "allreduce")))
    h = b.store.culprits.hosts(clock.now_ns())[0]
    assert (h.host, h.sessions, h.jobs, h.flagged) == ("node1", 3, 2, True)
    assert dict(h.causes) == {"slow_compute": 1, "host_bound": 1, "hang": 1}
    assert b.store.culprits.hosts(clock.now_ns(), min_sessions=4)[0].flagged is False
    assert b.store.culprits.hosts(clock.now_ns() + 8 * DAY_NS) == []  # outside the 7-day window

    metrics = LocalizerMetrics(lambda: {}, lambda: b.store.culprits.counts(clock.now_ns()))
    text = metrics.exposition().decode()
    assert 'perftracker_localizer_culprit_sessions{cause="slow_compute",host="node1"} 1.0' in text
    assert 'perftracker_localizer_culprit_sessions{cause="hang",host="node1"} 1.0' in text
    b.store.close()
    a.store.close()

    proc = subprocess.run([sys.executable, "-m", "perftracker", "hosts", "--store", str(path), "--days", "100000",
                           "--format", "json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["hosts"]
    assert [(r["host"], r["sessions"], r["flagged"]) for r in rows] == [("node1", 3, True)]
    text_out = subprocess.run([sys.executable, "-m", "perftracker", "hosts", "--store", str(path), "--days", "100000"],
                              capture_output=True, text=True, timeout=60).stdout
    assert "node1" in text_out and "FLAGGED" in text_out


def test_baseline_cli_lists_and_retakes(tmp_path: Path) -> None:
    from service_helpers import make_pattern_set

    path = tmp_path / "localizer.sqlite"
    store = Store(path)
    store.baselines.put("jobA", "s1", T0, [make_pattern_set("jobA", "s1", r, 2) for r in range(2)])
    store.close()
    out = subprocess.run([sys.executable, "-m", "perftracker", "baseline", "--store", str(path), "--format", "json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [(b["job"], b["session"], b["ranks"]) for b in json.loads(out.stdout)] == [("jobA", "s1", 2)]
    out = subprocess.run([sys.executable, "-m", "perftracker", "baseline", "jobA", "--retake", "--store", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "baseline dropped (2 rank(s))" in out.stdout
    assert Store(path).baselines.info() == []
