"""The training thread's wait for a core: the schedstat run_delay series, its intervals, the
summarizer's CPU-wait function (a real thread that shares a core with a busy process:
tests/accuracy/test_cpu_wait_share.py)."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.agent.samplers.cpuwait import cpu_wait_series
from perftracker.agent.summarize.summarizer import CPU_WAIT_KEY, SummarizeOptions, summarize_window
from perftracker.agent.summarize.timeline import wait_intervals

from perftracker.model.raw_window import EventKind as K
from perftracker.model.raw_window import SampleSet, UtilSeries
from tests.rawbuild import TRAIN_TID as T
from tests.rawbuild import by_key, raw_window

MS = 1_000_000


def test_a_wait_is_placed_before_the_run_that_follows_it() -> None:
    # readings every 1 ms; the thread waits 5 ms, the kernel credits it at the reading at 10 ms,
    # where the thread has run 0.5 ms since it got its core
    t = np.arange(0, 13) * MS
    run = np.zeros(13, np.int64)
    run[10:] = MS // 2
    wait = np.zeros(13, np.int64)
    wait[10:] = 5 * MS
    s = cpu_wait_series(t, run, wait, MS)
    assert s.resource == "cpu_wait" and len(s.t_ns) == 12
    # the wait is [4.5, 9.5] ms; value[i] covers (i, i+1] ms
    expected = np.zeros(12)
    expected[4] = expected[9] = 0.5
    expected[5:9] = 1.0
    assert s.value.astype(float) == pytest.approx(expected, abs=1e-6)


def test_waits_never_overlap_and_shares_stay_in_unit_interval() -> None:
    t = np.arange(0, 6) * MS
    run = np.zeros(6, np.int64)
    wait = np.array([0, 3, 6, 6, 6, 6], np.int64) * MS  # two 3 ms waits credited 1 ms apart: only 2 ms fit
    s = cpu_wait_series(t, run, wait, MS)
    assert np.all((s.value >= 0) & (s.value <= 1))
    assert s.value.sum() == pytest.approx(2.0, abs=1e-6)  # what fits between the first reading and the second credit


def test_no_readings_or_no_waits() -> None:
    assert len(cpu_wait_series(np.array([5]), np.array([0]), np.array([0]), MS).t_ns) == 0
    s = cpu_wait_series(np.arange(4) * MS, np.arange(4) * MS, np.zeros(4, np.int64), MS)
    assert len(s.t_ns) == 3 and not s.value.any()


def test_wait_intervals_merge_adjacent_samples_and_keep_the_total() -> None:
    v = np.array([0, 0.4, 1, 1, 0.3, 0, 0.2, 0], np.float32)
    t = (np.arange(len(v)) + 1) * MS
    start, end = wait_intervals(UtilSeries("cpu_wait", t, v, MS, "fixture"))
    # (1,2] 0.4 at its end, (2,3] (3,4] full, (4,5] 0.3 at its start: one wait [1.6, 4.3] ms; then 0.2 at (6,7]'s end
    assert start.tolist() == [int(1.6 * MS), int(6.8 * MS)]
    assert end.tolist() == [int(4.3 * MS), 7 * MS]
    assert (end - start).sum() == pytest.approx(float((v * MS).sum()), abs=2)


def test_summarizer_charges_the_wait_to_its_own_function_not_to_the_op_it_interrupted() -> None:
    raw = raw_window([(K.CPU_OP, "aten::addmm", T, 0, 100 * MS), (K.CPU_OP, "aten::relu", T, 100 * MS, 120 * MS)],
                     window=(0, 200 * MS))
    v = np.zeros(200, np.float32)
    v[20:60] = 1.0  # (20, 60] ms: runnable without a core, inside addmm
    t = (np.arange(200) + 1) * MS
    run = np.where(v > 0, 0.0, 0.9).astype(np.float32)
    run[20:60:10] = 0.5  # samples the wait shares with runs: they must not give the wait a utilization
    waits = SampleSet({"cpu_wait": UtilSeries("cpu_wait", t, v, MS, "fixture"),
                       "cpu": UtilSeries("cpu", t, run, MS, "fixture")})
    got = by_key(summarize_window(raw, waits))
    assert got["aten::addmm"].beta == pytest.approx(0.30)  # 100 ms - 40 ms waiting
    assert got["aten::addmm"].mu == pytest.approx(0.9, abs=0.05)
    assert got[CPU_WAIT_KEY].beta == pytest.approx(0.20) and got[CPU_WAIT_KEY].category.value == "compute"
    assert got[CPU_WAIT_KEY].mu == 0 and got[CPU_WAIT_KEY].sigma == 0  # the thread did not run
    assert got["aten::relu"].beta == pytest.approx(0.10)
    off = by_key(summarize_window(raw, waits, SummarizeOptions(cpu_wait=False)))
    assert CPU_WAIT_KEY not in off and off["aten::addmm"].beta == pytest.approx(0.5)


def test_on_a_gpu_window_a_host_wait_does_not_take_the_kernels_time() -> None:
    raw = raw_window([(K.PYTHON, "train.py(10): step", T, 0, 100 * MS),
                      (K.KERNEL, "gemm", 7, 0, 50 * MS, 0)], window=(0, 100 * MS))
    v = np.zeros(100, np.float32)
    v[30:70] = 1.0  # the host waits (30, 70] ms; the kernel runs until 50 ms
    t = (np.arange(100) + 1) * MS
    got = by_key(summarize_window(raw, SampleSet({"cpu_wait": UtilSeries("cpu_wait", t, v, MS, "fixture")})))
    assert got["gemm"].beta == pytest.approx(0.5)
    assert got[CPU_WAIT_KEY].beta == pytest.approx(0.2) and got[CPU_WAIT_KEY].category.value == "python"
    assert got["train.py(10): step"].beta == pytest.approx(0.3)

