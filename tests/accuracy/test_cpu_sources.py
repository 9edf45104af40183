"""The CPU sources against the thread's true share, per 40 ms phase of a real thread: perf task-clock
(the default where permitted) and schedstat (forced, or the fallback when the kernel refuses perf)
sample one alternating thread side by side (tests/cpu_phases.py). Statistical bounds measured on a
live host (docs/profile-window.md quotes them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from perftracker.agent.samplers.taskclock import (
    TaskClockUnavailable,
    open_task_clock,
)

from tests.cpu_phases import (
    drop_caps_for_perf,
    perf_refusal_can_be_forced,
    phase_estimates,
    run_side_by_side,
)

# Tolerances, per busy or sleep phase of 40 ms, against the thread's own time.thread_time_ns
# (docs/profile-window.md quotes these). perf is exact up to the samples that straddle an
# edge. schedstat knows when the kernel charged run time only to within a sample period, so its
# rebuilt staircase can move up to half a period (0.5 ms) of run time across an edge: one 1 ms
# sample just before a busy call can read ~0.5 ("sleep_inside": the mean of the samples fully
# inside a 40 ms sleep).
PERF_TOL = {"median": 0.01, "p90": 0.04, "sleep_inside": 0.01, "sleep_median": 0.015}
# sleep_median: a sleep phase's estimate carries its edge samples (up to 1 ms of the neighbouring
# busy call in a 40 ms phase); measured median error 0.0078-0.0087 on a quiet host (six runs, before
# and after the cpu_wait change), 0.0101 once with another test run beside the suite.
# On a quiet host, where the busy thread gets ~0.96-0.98 of a core, schedstat's rebuilt staircase
# reads low by 0.04-0.07 per phase (measured in two full-suite runs: medians 0.038 and 0.065, p90
# 0.052 and 0.073), more than under load (0.003-0.015): the tolerance covers both.
SCHEDSTAT_TOL = {"median": 0.1, "p90": 0.15, "sleep_inside": 0.025}


# One rerun: the phases are 40 ms of a real thread on a shared 2-core host. A full-suite run on
# 2026-11-26 read p90 0.083 for perf (one phase hit by the host; median 0.0088, within tolerance),
# while two other full runs the same day and CI passed. The tolerances stay as they are. A later CI
# run on a host with 10-20 % hypervisor steal read perf 0.835 against thread_time's 0.651: the
# truth for perf is now the thread's own task-clock (tests/cpuclock.py), which counts steal too.
@pytest.mark.flaky(reruns=1)
def test_cpu_sources_match_the_threads_true_share(tmp_path: Path) -> None:
    """perf (the default where permitted) and schedstat (forced) sample one thread side by side."""
    series, phases, logs = run_side_by_side(tmp_path, {"auto": ([], None), "schedstat": (["--cpu-source", "schedstat"], None)})
    assert "cpu source schedstat (forced" in logs["schedstat"] and series["schedstat"].source == "schedstat"
    try:
        os.close(open_task_clock(os.getpid()))
        perf_ok = True
    except TaskClockUnavailable:
        perf_ok = False
    assert series["auto"].source == ("perf" if perf_ok else "schedstat")
    assert ("cpu source perf" if perf_ok else "cpu source schedstat") in logs["auto"]
    truth = np.array([sched for kind, _, _, sched, _ in phases if kind == "busy"])
    assert np.median(truth) > 0.03, "the machine is too loaded for this test to mean anything"
    report = {"true_busy_share": round(float(truth.mean()), 3)}
    for name, tol in (("auto", PERF_TOL if perf_ok else SCHEDSTAT_TOL), ("schedstat", SCHEDSTAT_TOL)):
        est = phase_estimates(series[name], phases)
        busy_err = np.abs(est["busy"][:, 1] - est["busy"][:, 0])
        sleep_err = np.abs(est["sleep"][:, 1] - est["sleep"][:, 0])
        report[series[name].source] = {"busy": round(float(est["busy"][:, 1].mean()), 3),
                                       "busy_inside": round(float(np.nanmean(est["busy"][:, 2])), 3),
                                       "busy_err_median": round(float(np.median(busy_err)), 4),
                                       "busy_err_p90": round(float(np.percentile(busy_err, 90)), 4),
                                       "sleep": round(float(est["sleep"][:, 1].mean()), 4),
                                       "sleep_inside": round(float(np.nanmedian(est["sleep"][:, 2])), 4)}
        assert np.median(busy_err) <= tol["median"] and np.percentile(busy_err, 90) <= tol["p90"], report
        assert np.median(sleep_err) <= tol.get("sleep_median", tol["median"]), report
        assert np.percentile(sleep_err, 90) <= tol["p90"], report
        # the samples fully inside a sleep read ~0 although a sibling thread burns CPU all along
        assert np.nanmedian(est["sleep"][:, 2]) < tol["sleep_inside"], report
        # the samples fully inside a busy call carry its share (the stretch is shorter, hence looser)
        assert np.nanmedian(np.abs(est["busy"][:, 2] - est["busy"][:, 0])) <= 2 * tol["median"] + 0.02, report
    print(json.dumps(report))


@pytest.mark.skipif(not perf_refusal_can_be_forced(), reason="needs root and perf_event_paranoid >= 2 to make the kernel refuse")
def test_refused_perf_falls_back_to_schedstat_that_tracks_the_true_share(tmp_path: Path) -> None:
    """Without CAP_PERFMON/CAP_SYS_ADMIN the kernel refuses perf_event_open; the schedstat source it
    falls back to still tracks the thread's true share (the fallback itself, without a bound:
    tests/component/test_samplers.py)."""
    series, phases, logs = run_side_by_side(tmp_path, {"nocap": ([], drop_caps_for_perf)}, n=12)
    cpu = series["nocap"]
    assert cpu.source == "schedstat", logs["nocap"]
    est = phase_estimates(cpu, phases)
    busy_err = np.abs(est["busy"][:, 1] - est["busy"][:, 0])
    assert np.median(busy_err) <= SCHEDSTAT_TOL["median"], (busy_err, est["busy"][:, 0])
    assert np.nanmedian(est["sleep"][:, 2]) < SCHEDSTAT_TOL["sleep_inside"]
