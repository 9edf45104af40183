"""The cause under contention (issue 31): a rank that does more of its own work on a busy host waits
more for a core too, and the report names its work; CPU starvation is the cause only when the rank's
own work did not grow and its run-queue delay did (localizer/diagnose/evidence/cpu_starvation.py).

Hand-built CPU windows of a synchronous job, from a time model of one step: every rank runs its own
ops (``own`` s), waits ``q`` × that for a core (the busy host), and waits in the all-reduce for the
slowest rank; each β is that time over the step. The rank under test changes its own work, its
``q``, or both; the others spread by seeded noise.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from perftracker.localizer.diagnose.evidence.cpu_starvation import (
    CPU_WAIT_KEY,
    WORK_GREW,
    judge_cpu_wait,
    stretch,
)
from perftracker.localizer.diagnose.localize import localize_arrays
from perftracker.localizer.diagnose.method.arrays import FunctionInfo, PatternArrays
from perftracker.localizer.diagnose.method.options import LocalizeOptions

from perftracker.model import Category

OPTS = LocalizeOptions(created_ns=1)
FUNCS = (FunctionInfo("aten::mm", "aten::mm", Category.COMPUTE),
         FunctionInfo("aten::addmm", "aten::addmm", Category.COMPUTE),
         FunctionInfo("train.py(40): forward", "train.py(40): forward", Category.PYTHON),
         FunctionInfo(CPU_WAIT_KEY, CPU_WAIT_KEY, Category.COMPUTE),
         FunctionInfo("gloo:all_reduce", "gloo:all_reduce", Category.COLLECTIVE))
MM, ADDMM, PY, WAIT, AR = range(5)
OWN_S = np.array([0.030, 0.030, 0.008])  # mm, addmm, python per step on a rank with no fault
Q_BUSY = 1.8  # a busy host: each rank waits 1.8 s for a core per s it runs


def _job(n: int, rank: int, mm_factor: float, q_factor: float, seed: int) -> PatternArrays:
    """``rank`` runs aten::mm ``mm_factor`` × as long as the others' median and waits ``q_factor`` × their
    median per unit of work (exactly, so that a factor near a bar stays on its side of it)."""
    rng = np.random.default_rng(seed)
    own = OWN_S[:, None] * np.exp(rng.normal(0, 0.03, (3, n)))
    others = np.arange(n) != rank
    own[:, rank] = np.median(own[:, others], axis=1)  # the rank under test: exactly the others' median,
    own[0, rank] *= mm_factor                         # then its fault
    q = Q_BUSY * np.exp(rng.normal(0, 0.05, n))
    q[rank] = float(np.median(q[others])) * q_factor
    busy = own.sum(axis=0) * (1 + q)  # own work plus its waits for a core
    floor = 0.01 * np.exp(rng.normal(0, 0.05, n))  # the all-reduce itself
    step = float(busy.max() + floor.max()) * 1.02
    values = np.zeros((len(FUNCS), 3, n))
    values[:3, 0, :] = own / step
    values[WAIT, 0, :] = own.sum(axis=0) * q / step
    values[AR, 0, :] = (step - busy) / step
    values[:3, 1, :] = 0.95  # CPU utilization of the ops
    return PatternArrays(job="j", session="s", ranks=np.arange(n), functions=FUNCS, values=values, window_s=3.0,
                         gpu=False, world_size=n)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize(("mm_factor", "q_factor"), [(1.6, 1.0), (3.0, 1.0), (2.0, 0.8), (1.6, 1.15)])
def test_a_rank_with_extra_matmuls_on_a_busy_host_is_named_by_its_matmuls(n: int, mm_factor: float,
                                                                          q_factor: float) -> None:
    """Its own work grew (aten::mm 1.6-3×) and its wait for a core per unit of work stayed 0.8-1.15×
    the others': the headline is rank 1's aten::mm with the others waiting for it, and no finding
    says CPU starvation."""
    arr = _job(n, 1, mm_factor, q_factor, seed=n * 10 + int(mm_factor * 10))
    report = localize_arrays(arr, OPTS)
    head = report.findings[0] if report.findings else None
    assert head is not None and head.ranks == (1,) and head.label == "aten::mm", report.summary
    assert {r for w in head.waits for r in w.ranks} == set(range(n)) - {1}, report.summary
    assert "starvation" not in report.summary.lower(), report.summary
    assert all(f.label != CPU_WAIT_KEY for f in report.findings), [f.sentence for f in report.findings]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("q_factor", [1.5, 3.0])
def test_a_starved_rank_is_named_by_its_wait_for_a_core(n: int, q_factor: float) -> None:
    """Its own work is as the others' and it waits 1.5-3× as long per unit of work: CPU starvation."""
    arr = _job(n, 1, 1.0, q_factor, seed=n * 10 + int(q_factor * 10))
    report = localize_arrays(arr, OPTS)
    assert report.findings and report.findings[0].ranks == (1,), report.summary
    head = report.findings[0]
    assert head.label == CPU_WAIT_KEY and "CPU starvation" in head.sentence, report.summary


@pytest.mark.parametrize(("mm_factor", "work"), [(1.15, False), (1.35, True)])
def test_near_the_work_bar_a_rank_that_also_waits_more_per_unit_of_work_is_named_by_its_work_only_above_it(
        mm_factor: float, work: bool) -> None:
    """Rank 1 waits 1.6× the others per unit of work, and its aten::mm is 1.15× or 1.35× theirs: an
    excess of 0.45 or 1.05 × WORK_GREW of their own work. Below the bar the work did not grow and the
    wait is CPU starvation; above it the headline is the work, with the CPU wait as its clause."""
    arr = _job(4, 1, mm_factor, 1.6, seed=5)
    report = localize_arrays(arr, OPTS)
    assert report.findings and report.findings[0].ranks == (1,), report.summary
    head = report.findings[0]
    if work:
        assert head.label == "aten::mm" and "starvation" not in report.summary.lower(), report.summary
        assert f"also compute op {CPU_WAIT_KEY}" in head.sentence, head.sentence
    else:
        assert head.label == CPU_WAIT_KEY and "CPU starvation" in head.sentence, report.summary


def _uneven_quota(seed: int) -> tuple[np.ndarray, list[int]]:
    """The CPU fault suite's slow-compute-rank as a live window measured it (a 0.3-CPU quota on rank
    3 of 4 ranks on 2 cores): its own functions run 1.1-1.7× longer, spread over many small Python
    frames, and its CPU wait is 2.4× the others'. Rows: 24 own functions, then the CPU wait."""
    rng = np.random.default_rng(seed)
    peers_own = np.r_[0.018, 0.007, 0.006, 0.005, np.full(20, 0.004)]  # addmm, a few ops, 20 Python frames
    rank_own = peers_own * rng.uniform(1.1, 1.7, peers_own.size)
    own = np.column_stack([peers_own * np.exp(rng.normal(0, 0.05, peers_own.size)) for _ in range(3)]
                          + [rank_own])
    return np.vstack([own, [[0.14, 0.20, 0.17, 0.42]]]), list(range(peers_own.size))


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_a_cpu_quota_that_stretches_every_op_unevenly_is_no_extra_work(seed: int) -> None:
    """Growth beyond the stretch spread thinly over many functions sums past WORK_GREW, but no one
    function grew by it: that is the uneven stretch of a throttled processor, and the CPU wait keeps
    its finding (the report had named ``backward``, 0.24% of the window, as the rank's Python work)."""
    beta, fs = _uneven_quota(seed)
    v = judge_cpu_wait(beta, fs, np.array([3]), np.array([0, 1, 2]))
    assert v.excess >= WORK_GREW * v.own_peers, v  # the sum alone would have called it work
    assert not v.work_grew, v


@pytest.mark.parametrize(("bar", "grew"), [(0.9, False), (1.1, True)])
def test_under_a_quota_one_function_grown_on_its_own_past_the_bar_is_work(bar: float, grew: bool) -> None:
    """The twin: the same throttled rank with one function grown beyond the stretch by 0.9 or 1.1 ×
    WORK_GREW of the peers' own β on top of its stretch."""
    beta, fs = _uneven_quota(31)
    v0 = judge_cpu_wait(beta, fs, np.array([3]), np.array([0, 1, 2]))
    on_peers = np.median(beta[fs, :3], axis=1)
    f = 5  # a Python frame that held 0.4% of the window
    beta[f, 3] = stretch(beta[fs, 3], on_peers) * on_peers[f] + bar * WORK_GREW * v0.own_peers
    v = judge_cpu_wait(beta, fs, np.array([3]), np.array([0, 1, 2]))
    assert v.work_grew is grew, v
    if grew:
        assert v.work == f, v


def test_peers_waiting_in_python_frames_are_not_work_they_did() -> None:
    """A pipeline's peers wait for the late stage in a Python frame (``_wait_batch_p2p``), an own
    function by category that the late rank holds less: it does not hide the late rank's extra
    matmuls (the real 4-stage 1F1B job on a loaded host: 0.55 of the window on the peers, 0.10 on it)."""
    beta = np.array([[0.003, 0.003, 0.149, 0.003],   # aten::mm
                     [0.55, 0.56, 0.10, 0.52],       # schedules.py(678): _wait_batch_p2p
                     [0.13, 0.19, 0.54, 0.18]])      # the CPU wait
    v = judge_cpu_wait(beta, [0, 1], np.array([2]), np.array([0, 1, 3]))
    assert v.work == 0 and v.work_grew, v


def test_a_busy_host_with_no_fault_has_no_finding() -> None:
    report = localize_arrays(_job(4, 1, 1.0, 1.0, seed=9), OPTS)
    assert report.findings == (), [f.sentence for f in report.findings]


@pytest.mark.parametrize(("bar", "grew"), [(0.95, False), (1.05, True)])
def test_own_work_grows_at_the_bar(bar: float, grew: bool) -> None:
    """The verdict itself, on rows: rank 2's second own function holds 0.95 or 1.05 × WORK_GREW of the
    peers' own β (0.3) more than theirs, its first is as theirs."""
    extra = 0.3 * WORK_GREW * bar
    beta = np.array([[0.1, 0.1, 0.1], [0.2, 0.2, 0.2 + extra], [0.5, 0.5, 0.1]])
    v = judge_cpu_wait(beta, [0, 1], np.array([2]), np.array([0, 1]))
    assert v.work_grew is grew and v.work == 1, v


@pytest.mark.parametrize("factor", [1.5, 2.0, 3.0])
def test_every_op_longer_alike_is_no_extra_work(factor: float) -> None:
    """A CPU quota (the fault suite's slow-compute-rank): every own function of rank 2 runs ``factor`` ×
    longer, with a little seeded noise. That is a slower processor, not more work: no function grew
    beyond the stretch, so the CPU wait keeps its finding. Its twin: the same rank with one function
    grown on top of the stretch is its work."""
    rng = np.random.default_rng(int(factor * 10))
    peers_own = np.array([0.10, 0.06, 0.04, 0.02])  # e.g. aten::bmm, __getitem__, _single_tensor_sgd, python
    rank_own = peers_own * factor * np.exp(rng.normal(0, 0.03, 4))
    wait = np.array([[0.2, 0.2, 0.2 * factor]])
    beta = np.vstack([np.column_stack([peers_own, peers_own, rank_own]), wait])
    v = judge_cpu_wait(beta, [0, 1, 2, 3], np.array([2]), np.array([0, 1]))
    assert not v.work_grew, v
    beta[1, 2] += 0.1  # one function grows beyond the stretch by half the peers' own work
    v = judge_cpu_wait(beta, [0, 1, 2, 3], np.array([2]), np.array([0, 1]))
    assert v.work_grew and v.work == 1, v


def _pipeline(seed: int, replicas: int) -> PatternArrays:
    """A 4-stage pipeline (×``replicas`` data-parallel) on a busy host; stage 2 of replica 0 runs
    aten::mm 3× and waits for a core per unit of work like the others."""
    arr = _job(4 * replicas, 2, 3.0, 1.0, seed)
    return dataclasses.replace(arr, stage=np.tile(np.arange(4), replicas))


def test_a_pipeline_of_one_rank_per_stage_names_the_slowed_ranks_work_not_a_stage() -> None:
    """One rank per stage: a heavy stage and a slowed rank are the same data; the headline is rank 2's
    aten::mm with the three other stages waiting for it, and no stage cause, no CPU starvation."""
    report = localize_arrays(_pipeline(31, 1), OPTS)
    head = report.findings[0] if report.findings else None
    assert head is not None and head.ranks == (2,) and head.label == "aten::mm", report.summary
    assert head.waits, report.summary  # the other stages wait for it (here judged per stage: the p2p row is synthetic)
    assert not any(f.label.startswith("pipeline stage") for f in report.findings), report.summary
    assert "starvation" not in report.summary.lower(), report.summary


def test_the_wait_for_a_core_is_no_stage_compute() -> None:
    """The twin: two replicas, every rank of stage 2 waits 1.5× as long for a core per unit of work
    and computes as much as the others: no stage computes more (the wait is not compute); the
    finding, if any, is CPU starvation, never a stage imbalance."""
    arr = _job(8, 2, 1.0, 1.5, seed=32)
    arr.values[:, :, 6] = arr.values[:, :, 2]  # stage 2 of the second replica starved alike
    arr = dataclasses.replace(arr, stage=np.tile(np.arange(4), 2))
    report = localize_arrays(arr, OPTS)
    assert not any(f.label.startswith("pipeline stage") for f in report.findings), report.summary
