"""A lateness with no cause of its own on a host where the ranks wait for a core (issue 31,
localizer/diagnose/evidence/contention.py).

Hand-built CPU windows of a clean 2-rank FSDP2 job, shaped like the one the loaded 2-core host
measured (both ranks runnable without a core about half the window, the same own work, rank 0
waiting for rank 1 at all_gather_single by 9.6%): the late rank does nothing more and is starved no
more than its peer, so the wait evidence has no cause to name. Its twins: the same lateness on a
quiet host (no CPU wait) is still named, and near the bar a wait 0.9× / 1.1× the ranks' CPU wait
is not / is.
"""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.localizer.diagnose.evidence.contention import contention, within_contention
from perftracker.localizer.diagnose.evidence.cpu_starvation import CPU_WAIT_KEY
from perftracker.localizer.diagnose.localize import localize_arrays
from perftracker.localizer.diagnose.method.arrays import FunctionInfo, PatternArrays
from perftracker.localizer.diagnose.method.options import LocalizeOptions

from perftracker.model import Category, Report

OPTS = LocalizeOptions(created_ns=1)
AG_LABEL = "torch/distributed/distributed_c10d.py(4291): all_gather_single"
FUNCS = (FunctionInfo("autograd::engine::evaluate_function: AddmmBackward0",
                      "autograd::engine::evaluate_function: AddmmBackward0", Category.COMPUTE),
         FunctionInfo("fsdp2.py(36): main", "fsdp2.py(36): main", Category.PYTHON),
         FunctionInfo(CPU_WAIT_KEY, CPU_WAIT_KEY, Category.COMPUTE),
         FunctionInfo(AG_LABEL, AG_LABEL, Category.COLLECTIVE),
         FunctionInfo("torch/distributed/distributed_c10d.py(4846): reduce_scatter_single",
                      "torch/distributed/distributed_c10d.py(4846): reduce_scatter_single", Category.COLLECTIVE))
ADDMM, PY, WAIT, AG, RS = range(5)


def _job(cpu_wait: float, wait: float, seed: int, late_starved: float = 0.0) -> PatternArrays:
    """Rank 0 waits ``wait`` of the window for rank 1 at the all-gather; both ranks wait ``cpu_wait``
    for a core (rank 1 ``late_starved`` more), their own work the same but for seeded noise."""
    rng = np.random.default_rng(seed)
    values = np.zeros((len(FUNCS), 3, 2))
    values[ADDMM, 0, :] = 0.075 * np.exp(rng.normal(0, 0.02, 2))
    values[PY, 0, :] = 0.009 * np.exp(rng.normal(0, 0.02, 2))
    values[WAIT, 0, :] = [cpu_wait, cpu_wait + late_starved]
    values[AG, 0, :] = [0.11 + wait, 0.11]
    values[RS, 0, :] = 0.09 * np.exp(rng.normal(0, 0.02, 2))
    values[ADDMM, 1, :], values[PY, 1, :] = 0.2, 0.2
    values[AG:, 1, :] = 0.03
    return PatternArrays(job="j", session="s", ranks=np.arange(2), functions=FUNCS, values=values, window_s=3.0,
                         gpu=False, world_size=2)


def _named(report: Report) -> list[tuple[int, ...]]:
    return [f.ranks for f in report.findings if f.kind != "common"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_causeless_lateness_inside_the_hosts_contention_names_no_rank(seed: int) -> None:
    report = localize_arrays(_job(0.5, 0.096, seed), OPTS)
    assert _named(report) == [], report.summary


@pytest.mark.parametrize("seed", [1, 2])
def test_the_same_lateness_on_a_quiet_host_is_named(seed: int) -> None:
    report = localize_arrays(_job(0.0, 0.096, seed), OPTS)
    assert report.findings and report.findings[0].ranks == (1,), report.summary
    assert "arrives last" in report.findings[0].sentence and {r for w in report.findings[0].waits
                                                              for r in w.ranks} == {0}, report.summary


@pytest.mark.parametrize(("factor", "named"), [(0.9, False), (1.1, True), (3.0, True)])
def test_near_the_bar_a_lateness_above_the_ranks_cpu_wait_is_named(factor: float, named: bool) -> None:
    report = localize_arrays(_job(0.2, 0.2 * factor, seed=4), OPTS)
    if named:
        assert report.findings and report.findings[0].ranks == (1,), report.summary
    else:
        assert _named(report) == [], report.summary


def test_a_late_rank_starved_more_than_its_peer_is_still_named() -> None:
    """A cause of its own (the late rank alone waits 20% more for a core): cpu_starvation's verdict,
    untouched by the contention bar."""
    report = localize_arrays(_job(0.4, 0.2, seed=5, late_starved=0.2), OPTS)
    assert report.findings and report.findings[0].ranks == (1,), report.summary
    assert report.findings[0].label == CPU_WAIT_KEY, report.summary


def test_contention_is_the_median_cpu_wait_and_zero_without_it() -> None:
    arr = _job(0.3, 0.1, seed=6)
    assert contention(arr, np.array([0, 1])) == pytest.approx(0.3)
    assert within_contention(arr, 0.3, np.array([1]), np.array([0]))
    assert not within_contention(arr, 0.31, np.array([1]), np.array([0]))
    gpu = PatternArrays(job="j", session="s", ranks=np.arange(2), functions=FUNCS[:2], values=arr.values[:2],
                        window_s=3.0, gpu=True, world_size=2)
    assert contention(gpu, np.array([0, 1])) == 0.0
