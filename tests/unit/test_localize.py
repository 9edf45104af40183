"""localize(): the paper's cases on synthetic jobs at realistic scale, clean jobs, determinism, bad input."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from perftracker.localizer.diagnose.localize import localize, localize_arrays
from perftracker.localizer.diagnose.method.arrays import PatternArrays
from perftracker.localizer.diagnose.method.expect import parse_expectations
from perftracker.localizer.diagnose.method.options import LocalizeOptions

from bench import synthetic as sy
from perftracker.errors import InputError
from perftracker.model import Category, Pattern, PatternSet, Report

OPTS = LocalizeOptions(created_ns=1)


def _key(arr: PatternArrays, label: str) -> str:
    return arr.functions[sy.function_index(arr, label)].key


def test_throttled_gemm_on_300_of_2560_is_one_specific_finding() -> None:
    arr = sy.simulate_job(2560, seed=11)
    throttled = np.sort(np.random.default_rng(12).choice(2560, 300, replace=False))
    sy.inject_throttled_compute(arr, throttled)
    report = localize_arrays(arr, OPTS)
    assert len(report.findings) == 1, [f.sentence for f in report.findings]
    f = report.findings[0]
    assert f.key == _key(arr, "GEMM") and f.kind == "specific" and f.tests == ("differential",)
    assert f.ranks == tuple(throttled.tolist())
    assert f.observed.beta > f.median.beta and f.observed.mu < f.median.mu
    assert "slow or throttled GPU" in f.sentence and "300 of 2,560 ranks" in f.sentence


def test_nvlink_down_finds_the_48_and_all_3_pcie_workers() -> None:
    arr = sy.simulate_job(2560, seed=21)
    hosts = np.arange(1200, 1248)
    pcie = hosts[[3, 17, 40]]
    sy.inject_nvlink_down(arr, hosts, pcie)
    report = localize_arrays(arr, OPTS)
    by_key = {f.key: f for f in report.findings}
    assert set(by_key) == {_key(arr, "AllGather"), _key(arr, "Memcpy PtoP")}, [f.sentence for f in report.findings]
    assert by_key[_key(arr, "AllGather")].ranks == tuple(hosts.tolist())
    pf = by_key[_key(arr, "Memcpy PtoP")]
    assert pf.ranks == tuple(pcie.tolist()) and pf.kind == "specific"
    assert pf.observed.mu > 5 * pf.median.mu and "PCIe" in pf.sentence


def test_slow_recv_into_on_all_workers_is_common_through_expectation() -> None:
    arr = sy.simulate_job(1000, seed=31)
    sy.inject_slow_input(arr, 0.12)
    report = localize_arrays(arr, OPTS)
    assert len(report.findings) == 1
    f = report.findings[0]
    assert f.kind == "common" and "expectation" in f.tests and len(f.ranks) == 1000
    assert f.category is Category.PYTHON and f.expected.hi.beta == 0.01
    assert f.sentence.startswith("all ranks: Python socket.recv_into in data loading holds 12% of the window "
                                 "(expected ≤ 1%)")
    assert f.sentence.endswith("slow input pipeline/storage")


@pytest.mark.parametrize("seed", [41, 42, 43, 44, 45])
def test_clean_job_of_1000_workers_gives_zero_findings(seed: int) -> None:
    report = localize_arrays(sy.simulate_job(1000, seed=seed), dataclasses.replace(OPTS, seed=seed))
    assert report.findings == (), [f.sentence for f in report.findings]
    assert report.summary.startswith("no abnormal function on 1,000 ranks")
    assert [t.label for t in report.top_functions][:3] == ["GEMM", "flash_bwd_kernel", "flash_fwd_kernel"]


def test_gc_pauses_are_summarized_as_a_random_pattern() -> None:
    arr = sy.simulate_job(1000, seed=51)
    hit = sy.inject_gc_pauses(arr, 0.2, seed=52)
    report = localize_arrays(arr, OPTS)
    assert len(report.findings) == 1
    f = report.findings[0]
    assert f.kind == "random" and set(f.ranks) <= set(hit.tolist()) and len(f.ranks) > 0.5 * hit.size
    assert "random per-worker pattern" in f.sentence and "scattered" in f.sentence


@pytest.mark.parametrize("n", [8, 64])
def test_sleep_only_one_rank_runs_is_caught_by_the_differential_view(n: int) -> None:
    arr = sy.simulate_job(n, seed=61)
    sy.inject_sleep(arr, 5)
    sets = sy.to_pattern_sets(arr)
    sleep_key = _key(arr, "time.sleep")
    assert sum(1 for s in sets for p in s.patterns if p.key == sleep_key) == 1  # absent on the others
    # python is never unexpected in this file, so only the differential test can fire
    open_python = parse_expectations(
        {"profiles": {"open": {"range": [{"category": "python"}]}}}, "open")
    report = localize(sets, dataclasses.replace(OPTS, expectations=open_python))
    f = next(f for f in report.findings if f.key == sleep_key)
    assert f.ranks == (5,) and f.tests == ("differential",) and f.median.beta == 0.0
    assert "the process sleeps on the critical path" in f.sentence
    assert [g.key for g in report.findings] == [sleep_key]
    # with the built-in profile both tests fire
    both = localize(sets, OPTS).findings
    assert [(g.key, g.ranks, g.tests) for g in both] == [(sleep_key, (5,), ("expectation", "differential"))]


def test_localize_and_localize_arrays_agree_and_grid_equals_blocks() -> None:
    arr = sy.simulate_job(600, seed=71)
    sy.inject_throttled_compute(arr, np.arange(0, 600, 37))
    sy.inject_sleep(arr, 100)
    a = localize_arrays(arr, OPTS)
    b = localize(sy.to_pattern_sets(arr), OPTS)
    c = localize_arrays(arr, dataclasses.replace(OPTS, method="blocks"))
    assert a.findings and a.findings == c.findings
    assert [(f.key, f.ranks, f.kind, f.tests) for f in a.findings] == [
        (f.key, f.ranks, f.kind, f.tests) for f in b.findings]


def test_determinism_same_input_and_seed_same_report() -> None:
    def run() -> Report:
        arr = sy.simulate_job(3000, seed=81)
        sy.inject_throttled_compute(arr, np.arange(7, 3000, 97))
        sy.inject_gc_pauses(arr, 0.1, seed=82)
        return localize_arrays(arr, dataclasses.replace(OPTS, seed=123))

    r1, r2 = run(), run()
    assert r1 == r2 and r1.findings
    assert r1.to_dict() == r2.to_dict()
    assert Report.from_dict(r1.to_dict()).findings == r1.findings


def test_missing_ranks_make_a_partial_report() -> None:
    sets = sy.to_pattern_sets(sy.simulate_job(8, seed=91))
    report = localize([s for s in sets if s.rank != 3], OPTS)
    assert report.ranks_missing == (3,) and report.status == "partial"
    assert report.ranks_reported == (0, 1, 2, 4, 5, 6, 7) and report.profile == "gpu"


def test_profile_follows_gpu_flag_unless_overridden() -> None:
    sets = [dataclasses.replace(s, gpu=False) for s in sy.to_pattern_sets(sy.simulate_job(8, seed=92))]
    assert localize(sets, OPTS).profile == "cpu"
    assert localize(sets, dataclasses.replace(OPTS, profile="gpu")).profile == "gpu"


def _set(rank: int, session: str = "s", job: str = "j", beta: float = 0.2) -> PatternSet:
    return PatternSet(job=job, session=session, rank=rank, world_size=4, host="h", window_start_ns=0,
                      window_end_ns=20_000_000_000, patterns=(Pattern("k", Category.COMPUTE, beta, 0.5, 0.1),))


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        ([], "empty"),
        ([_set(0), _set(1), _set(1)], "duplicate ranks"),
        ([_set(0), _set(1, session="other")], "different sessions"),
        ([_set(0), _set(1, job="other")], "different jobs"),
        ([_set(0), _set(1, beta=math.nan)], "NaN beta"),
        ([_set(0), _set(1, beta=1.5)], "outside [0, 1]"),
    ],
)
def test_bad_input_gives_clear_errors(sets: list[PatternSet], needle: str) -> None:
    with pytest.raises(InputError, match=None) as err:
        localize(sets, OPTS)
    assert needle in str(err.value)


def test_bad_arrays_give_clear_errors() -> None:
    arr = sy.simulate_job(10, seed=1)
    arr.values[3, 1, 4] = np.nan
    with pytest.raises(InputError, match="rank 4: function .* has a NaN mu"):
        localize_arrays(arr, OPTS)
    arr = sy.simulate_job(10, seed=1)
    with pytest.raises(InputError, match=r"duplicate ranks .*\[2\]"):
        localize_arrays(dataclasses.replace(arr, ranks=np.array([0, 1, 2, 2, 4, 5, 6, 7, 8, 9])), OPTS)
    with pytest.raises(InputError, match="empty"):
        localize_arrays(dataclasses.replace(arr, ranks=np.zeros(0, np.int64), values=arr.values[:, :, :0]), OPTS)


def _four_ranks(triples: list[tuple[float, float, float]]) -> list[PatternSet]:
    return [PatternSet(job="j", session="s", rank=r, world_size=4, host=f"h{r}", gpu=False,
                       window_start_ns=0, window_end_ns=5 * 10**9,
                       patterns=(Pattern("aten::mm", Category.COMPUTE, b, m, s, label="aten::mm", resource="cpu"),))
            for r, (b, m, s) in enumerate(triples)]


def test_utilization_differences_below_ten_points_are_not_material() -> None:
    # measured shape (clean 4-rank CPU run, 2 cores): the same β everywhere, CPU utilization 0.5-0.6
    # and a within-op σ of 0.02-0.07 that swing with scheduling luck; P / max made one rank unique
    noisy = [(0.049, 0.52, 0.068), (0.050, 0.60, 0.020), (0.051, 0.58, 0.022), (0.048, 0.57, 0.025)]
    plain = localize(_four_ranks(noisy), LocalizeOptions(material_utilization=0.01))
    assert [f.ranks for f in plain.findings] == [(0,)]
    assert localize(_four_ranks(noisy)).findings == ()
    # a material difference still counts: one rank at 25 points lower CPU utilization
    throttled = [(0.050, 0.30, 0.02), (0.050, 0.60, 0.02), (0.051, 0.58, 0.02), (0.049, 0.57, 0.02)]
    report = localize(_four_ranks(throttled))
    assert [(f.ranks, f.kind) for f in report.findings] == [((0,), "specific")]


def test_a_unique_rank_must_also_be_materially_off_the_median_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # measured (clean-s0, 4 ranks on 2 cores): a Python frame at β 0.0108 against 0.0097, μ 0.44
    # against 0.34: P / max (floors included) put rank 2 more than ε from all three others
    frame = [(0.0090, 0.305, 0.346), (0.0102, 0.295, 0.348), (0.0108, 0.438, 0.307), (0.0091, 0.369, 0.392)]
    assert localize(_four_ranks(frame)).findings == ()
    with monkeypatch.context() as m:  # the same options without the materiality check: unique
        m.setattr("perftracker.localizer.diagnose.localize.material_shift", lambda values, *_: np.ones(values.shape[1], dtype=bool))
        assert [f.ranks for f in localize(_four_ranks(frame)).findings] == [(2,)]
    # 2.5 points of the window more in the op (the β floor, 0.01 / ε) is material
    slower = [(0.034, 0.60, 0.05), (0.033, 0.61, 0.05), (0.060, 0.58, 0.06), (0.034, 0.60, 0.05)]
    assert [f.ranks for f in localize(_four_ranks(slower)).findings] == [(2,)]
    # and so is a utilization 25 points off at the same β (the paper's PCIe case)
    pcie = [(0.02, 0.06, 0.03), (0.02, 0.07, 0.03), (0.02, 0.70, 0.06), (0.02, 0.06, 0.03)]
    assert [f.ranks for f in localize(_four_ranks(pcie)).findings] == [(2,)]


def test_a_rank_that_waits_longer_for_late_peers_is_a_victim_not_a_finding() -> None:
    from perftracker.localizer.diagnose.method.expect import load_expectations

    key = "ddp.reducer::wait, varying part (late peers, in autograd engine)"

    def sets(betas: list[float]) -> list[PatternSet]:
        return [PatternSet(job="j", session="s", rank=r, world_size=4, host=f"h{r}", gpu=False,
                           window_start_ns=0, window_end_ns=5 * 10**9,
                           patterns=(Pattern(key, Category.COLLECTIVE, b, 0.1, 0.04, label=key, resource="nic"),))
                for r, b in enumerate(betas)]

    cpu = LocalizeOptions(expectations=load_expectations(None, "cpu"))
    # measured shape (slow-dataloader-all): rank 3 waited 27% of the window for late peers, the others about 18%
    assert localize(sets([0.15, 0.15, 0.16, 0.30]), cpu).findings == ()
    # the same pattern on a function not marked waits_for_peers is a finding
    other = LocalizeOptions(expectations=parse_expectations(
        {"profiles": {"x": {"range": [{"category": "collective"}]}}}, "x"))
    assert [f.ranks for f in localize(sets([0.15, 0.15, 0.16, 0.30]), other).findings] == [(3,)]
    # the rank that waits much less is the late one: still reported
    assert [f.ranks for f in localize(sets([0.18, 0.17, 0.19, 0.05]), cpu).findings] == [(3,)]
