"""(β, μ, σ) with Algorithm 1, exactly as docs/design.md section 5, on hand-built windows and samples."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.agent.summarize.patterns import critical_runs
from perftracker.agent.summarize.summarizer import SummarizeOptions, summarize_window

from perftracker.model import PatternSet
from perftracker.model.raw_window import EventKind as K
from tests.rawbuild import TRAIN_TID as T
from tests.rawbuild import by_key, raw_window, samples


def run(values: list[float], c: int) -> tuple[int, float, float]:
    r = critical_runs(np.array(values), np.zeros(len(values), dtype=np.int64), 1, c)
    return int(r.n_samples[0]), float(r.mean[0]), float(r.std[0])


def test_algorithm1_leading_and_trailing_zeros() -> None:
    assert run([0, 0, 1.0, 0.5, 0, 0], c=1) == (2, pytest.approx(0.75), pytest.approx(0.25))


def test_algorithm1_exactly_c_zeros_stay_inside() -> None:
    assert run([1.0, 0, 0, 1.0], c=2) == (4, pytest.approx(0.5), pytest.approx(0.5))


def test_algorithm1_c_plus_one_zeros_break() -> None:
    # pieces [1.0] and [0.5, 0.5]: the longer one wins
    assert run([1.0, 0, 0, 0, 0.5, 0.5], c=2) == (2, pytest.approx(0.5), pytest.approx(0.0))


def test_algorithm1_all_zeros() -> None:
    assert run([0, 0, 0], c=5) == (0, 0.0, 0.0)


def test_algorithm1_tie_takes_earliest_and_groups_are_independent() -> None:
    vals = np.array([0.2, 0, 0, 0.4, 1.0, 0, 0.6])
    grp = np.array([0, 0, 0, 0, 1, 1, 1])
    r = critical_runs(vals, grp, 3, 1)
    assert r.n_samples.tolist() == [1, 3, 0]
    assert r.mean[0] == pytest.approx(0.2)  # [0.2] and [0.4] tie: earliest
    assert r.mean[1] == pytest.approx(1.6 / 3)


def test_mu_sigma_weighted_by_critical_duration() -> None:
    # two executions of f: A covers samples 1..4 (values 1,1,1,0 -> d'=3, u=1, s=0),
    # B covers samples 6..7 (values 0.2, 0.6 -> d'=2, u=0.4, s=0.2)
    raw = raw_window([
        (K.PYTHON, "f", T, 0, 40),
        (K.PYTHON, "g", T, 40, 50),
        (K.PYTHON, "f", T, 50, 70),
    ], window=(0, 100))
    sm = samples("cpu", 10, [1, 1, 1, 0, 0.9, 0.2, 0.6, 0, 0, 0])
    p = by_key(summarize_window(raw, sm, SummarizeOptions(max_zero_run=1)))
    f = p["f"]
    assert f.beta == pytest.approx(0.6)
    assert f.mu == pytest.approx((3 * 1.0 + 2 * 0.4) / 5)
    assert f.sigma == pytest.approx((3 * 0.0 + 2 * 0.2) / 5)
    assert f.resource == "cpu"
    assert p["g"].mu == pytest.approx(0.9)


def test_only_self_segments_count_for_utilization() -> None:
    raw = raw_window([(K.PYTHON, "outer", T, 0, 100), (K.PYTHON, "inner", T, 20, 80)], window=(0, 100))
    sm = samples("cpu", 10, [0.5, 0.5, 1, 1, 1, 1, 1, 1, 0.5, 0.5])
    p = by_key(summarize_window(raw, sm, SummarizeOptions(max_zero_run=0)))
    assert p["outer;inner"].mu == pytest.approx(1.0)
    assert p["outer"].mu == pytest.approx(0.5)


def test_sleeping_function_has_zero_mu() -> None:
    raw = raw_window([(K.PYTHON, "sleep", T, 0, 50), (K.PYTHON, "busy", T, 50, 100)], window=(0, 100))
    sm = samples("cpu", 10, [0, 0, 0, 0, 0, 1, 1, 0.8, 1, 1])
    p = by_key(summarize_window(raw, sm))
    assert p["sleep"].mu == 0.0 and p["sleep"].sigma == 0.0
    assert p["busy"].mu == pytest.approx(0.96)


def test_category_resource_matching() -> None:
    raw = raw_window([
        (K.KERNEL, "gemm", 7, 0, 40, 0),
        (K.MEMCPY, "Memcpy HtoD", 8, 40, 60, 0),
        (K.KERNEL, "ncclDevKernel_AllGather", 9, 60, 80, 0),
        (K.PYTHON, "loop", T, 80, 100),
    ], window=(0, 100))
    from perftracker.model.raw_window import SampleSet

    sets = {name: samples(name, 10, [v] * 10).get(name) for name, v in
            (("sm", 0.9), ("pcie", 0.3), ("nvlink", 0.7), ("nic", 0.1), ("cpu", 0.5))}
    p = by_key(summarize_window(raw, SampleSet(sets)))
    assert (p["gemm"].resource, p["gemm"].mu) == ("sm", pytest.approx(0.9))
    assert (p["Memcpy HtoD"].resource, p["Memcpy HtoD"].mu) == ("pcie", pytest.approx(0.3))
    assert (p["ncclDevKernel_AllGather"].resource, p["ncclDevKernel_AllGather"].mu) == ("nvlink", pytest.approx(0.7))
    assert (p["loop"].resource, p["loop"].mu) == ("cpu", pytest.approx(0.5))


def test_offline_no_samples_gives_beta_only() -> None:
    raw = raw_window([(K.CPU_OP, "aten::mm", T, 0, 100)], window=(0, 100))
    p = by_key(summarize_window(raw))["aten::mm"]
    assert (p.beta, p.mu, p.sigma, p.resource) == (1.0, 0.0, 0.0, "")


def test_pattern_budget_floor_and_roundtrip() -> None:
    events = [(K.PYTHON, "root", T, 0, 10_000_000)]
    for i in range(3000):  # 3000 distinct stacks, 200 ns each
        events.append((K.PYTHON, f"mod_{i}.py({i}): fn_{i}", T, 1000 + i * 3000, 1000 + i * 3000 + 200 + i))
    raw = raw_window(events, window=(0, 10_000_000))
    ps = summarize_window(raw)
    data = ps.to_bytes()
    assert len(data) <= 10_000
    assert 0 < len(ps.patterns) <= 256
    betas = [p.beta for p in ps.patterns]
    assert betas == sorted(betas, reverse=True) and min(betas) >= 1e-4
    assert PatternSet.from_bytes(data).patterns[0].key == ps.patterns[0].key
    small = summarize_window(raw, options=SummarizeOptions(max_bytes=1500))
    assert len(small.to_bytes()) <= 1500 and len(small.patterns) < len(ps.patterns)


def test_executions_shorter_than_a_period_take_overlapping_samples_weighted_by_overlap() -> None:
    # "op" runs 3 ns in each 10 ns sample (never a whole sample inside); sample values alternate
    # 1.0 / 0.5, and one execution straddles two samples (7 ns in a 1.0 sample, 2 ns in a 0.5 one)
    events = [(K.CPU_OP, "aten::op", T, 10 * i + 2, 10 * i + 5) for i in range(8)]
    events.append((K.CPU_OP, "aten::op", T, 83, 92))
    raw = raw_window(events, window=(0, 100))
    vals = [1.0, 0.5] * 5
    sm = samples("cpu", 10, vals)
    p = by_key(summarize_window(raw, sm))["aten::op"]
    # the i-th 3 ns execution lies in sample i; the last overlaps samples 8 (7 ns) and 9 (2 ns)
    num = sum(3 * vals[i] for i in range(8)) + 7 * vals[8] + 2 * vals[9]
    assert p.mu == pytest.approx(num / (8 * 3 + 9))
    m9 = (7 * 1.0 + 2 * 0.5) / 9
    s9 = ((7 * (1.0 - m9) ** 2 + 2 * (0.5 - m9) ** 2) / 9) ** 0.5
    assert p.sigma == pytest.approx(9 * s9 / (8 * 3 + 9))


def test_short_executions_in_zero_samples_add_nothing_and_long_ones_keep_algorithm_1() -> None:
    # a short op that only ever ran while the sample reads 0 gets no weight (as Algorithm 1 gives an
    # all-zero execution); a long execution with whole samples inside ignores the straddling ones
    raw = raw_window([
        (K.CPU_OP, "aten::short", T, 2, 5),
        (K.CPU_OP, "aten::long", T, 15, 60),
    ], window=(0, 100))
    sm = samples("cpu", 10, [0, 1, 0.2, 0.4, 0.6, 0.8, 1, 1, 1, 1])
    p = by_key(summarize_window(raw, sm, SummarizeOptions(max_zero_run=1)))
    assert p["aten::short"].mu == 0.0 and p["aten::short"].sigma == 0.0
    # whole samples inside (15, 60]: (20,30] .. (50,60] -> 0.2, 0.4, 0.6, 0.8; the straddling
    # (10,20] sample (1.0) is left out
    assert p["aten::long"].mu == pytest.approx(0.5)

