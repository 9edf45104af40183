"""GPU evidence end to end through the summarizer and the localizer (issue 34): a throttled GPU, a
slow InfiniBand port inside a single group, a PCIe fallback; each found, each with a must-not twin.

Each rank's window is built by hand (a GPU job of 8 ranks: host op, a GEMM, an all-reduce per step)
with hardware series in the samplers' own format (SampleSet: sm_clock with NVML's max clock in its
source, throttle reasons, ib_xmit_wait, nvlink/pcie/nic). Seeded noise on every series. The series'
levels are reasoned, not measured: not verified on hardware.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from perftracker.agent.summarize.hardware import link_series
from perftracker.agent.summarize.summarizer import summarize_window
from perftracker.localizer.diagnose.localize import localize

from perftracker.model import Category, PatternSet, Report
from perftracker.model.hardware import (
    GPU_CLOCK_KEY,
    IB_LINK_ERRORS,
    IB_WAIT_KEY,
    P2P_PCIE_KEY,
    SM_CLOCK,
    THROTTLE_POWER,
    THROTTLE_SW,
    THROTTLE_THERMAL,
    clock_source,
    parse_clock_label,
    reason_key,
)
from perftracker.model.raw_window import (
    COLUMNS,
    EventKind,
    RawWindow,
    SampleSet,
    UtilSeries,
    WindowMeta,
)

N = 8
STEP_NS = 10_000_000
STEPS = 10
WINDOW_NS = STEP_NS * STEPS
PERIOD_NS = 1_000_000
TRAIN, STREAM = 100, 7
GEMM = "sm90_xmma_gemm_f16f16_f32"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _window(rank: int, gemm_ns: int, allreduce_ns: int, local_world_size: int) -> RawWindow:
    """Per step: a host op launching a GEMM and an all-reduce of the whole job (group "0")."""
    rows, names, comm = [], {}, []

    def add(kind: EventKind, name: str, tid: int, s: int, e: int, dev: int = -1) -> None:
        rows.append((int(kind), names.setdefault(name, len(names)), tid, dev, s, e, -1, -1))

    for k in range(STEPS):
        t = k * STEP_NS
        add(EventKind.CPU_OP, "aten::mm", TRAIN, t, t + 200_000)
        add(EventKind.KERNEL, GEMM, STREAM, t + 300_000, t + 300_000 + gemm_ns, 0)
        s = t + 300_000 + gemm_ns + 100_000
        add(EventKind.KERNEL, ALLREDUCE, STREAM, s, s + allreduce_ns, 0)
        comm.append((ALLREDUCE, s, s + allreduce_ns, "0", "allreduce", k, -1, -1))
    cols = {col: np.array([r[j] for r in rows], dtype=dtype) for j, (col, dtype) in enumerate(COLUMNS.items())}
    meta = WindowMeta(job="j", session="s", rank=rank, world_size=N, host=f"h{rank // max(local_world_size, 1)}",
                      pid=1, training_tid=TRAIN, window_start_ns=0, window_end_ns=WINDOW_NS,
                      process_groups=(("0", "default_pg", tuple(range(N))),), comm=tuple(comm),
                      local_world_size=local_world_size)
    return RawWindow(meta=meta, columns=cols, names=tuple(names))


def _series(name: str, values: np.ndarray, source: str = "fixture") -> UtilSeries:
    t = PERIOD_NS * np.arange(1, len(values) + 1, dtype=np.int64)
    return UtilSeries(name, t, np.clip(values, 0, 1).astype(np.float32), PERIOD_NS, source)


def _busy(start_end: list[tuple[int, int]], level: float) -> np.ndarray:
    """Per period, level × the share of it inside the intervals."""
    n = WINDOW_NS // PERIOD_NS
    out = np.zeros(n)
    for s, e in start_end:
        for k in range(s // PERIOD_NS, min((e - 1) // PERIOD_NS + 1, n)):
            lo, hi = max(s, k * PERIOD_NS), min(e, (k + 1) * PERIOD_NS)
            out[k] += level * max(hi - lo, 0) / PERIOD_NS
    return out


def _samples(rank: int, rng: np.random.Generator, gemm_ns: int, allreduce_ns: int, *, clock: float = 1.0,
             reason: str = "", xmit_wait: float = 0.0, between_hosts: bool = False, link: str = "nvlink",
             link_util: float = 0.6) -> SampleSet:
    n = WINDOW_NS // PERIOD_NS
    ar = [(k * STEP_NS + 400_000 + gemm_ns, k * STEP_NS + 400_000 + gemm_ns + allreduce_ns) for k in range(STEPS)]
    series = {
        "sm": _series("sm", _busy([(k * STEP_NS + 300_000, k * STEP_NS + 300_000 + gemm_ns) for k in range(STEPS)],
                                  0.95)),
        SM_CLOCK: _series(SM_CLOCK, clock - rng.uniform(0, 0.03, n), clock_source("nvml", 1980)),
    }
    for name, key in ((THROTTLE_THERMAL, "thermal"), (THROTTLE_POWER, "power"), (THROTTLE_SW, "sw")):
        series[name] = _series(name, np.full(n, 1.0 if reason == key else 0.0), "nvml")
    if between_hosts:
        series["nic"] = _series("nic", _busy(ar, link_util) * rng.uniform(0.95, 1.05, n), "rdma")
        wait = rng.uniform(0.002, 0.006, n) + _busy(ar, xmit_wait)
        series["ib_xmit_wait"] = _series("ib_xmit_wait", wait, "rdma")
        series[IB_LINK_ERRORS] = _series(IB_LINK_ERRORS, np.zeros(n), "rdma")
    else:
        other = "pcie" if link == "nvlink" else "nvlink"
        series[link] = _series(link, _busy(ar, link_util) * rng.uniform(0.95, 1.05, n), "nvml")
        series[other] = _series(other, rng.uniform(0.0, 0.01, n), "nvml")
    return SampleSet(series=series)


def _job(seed: int, *, local_world_size: int = N, gemm_ns: dict[int, int] | None = None,
         allreduce_ns: int = 2_000_000, **per_rank: dict[int, object]) -> list[PatternSet]:
    rng = np.random.default_rng(seed)
    out = []
    for r in range(N):
        g = (gemm_ns or {}).get(r, 3_000_000) + int(rng.integers(-30_000, 30_000))
        a = allreduce_ns + int(rng.integers(-20_000, 20_000))
        kw = {k: v[r] for k, v in per_rank.items() if r in v}
        ss = _samples(r, rng, g, a, between_hosts=local_world_size < N, **kw)  # type: ignore[arg-type]
        out.append(summarize_window(_window(r, g, a, local_world_size), ss))
    return out


def _findings(report: Report, key: str) -> list:  # type: ignore[type-arg]
    return [f for f in report.findings if f.key == key]


# ------------------------------------------------------------------- a throttled GPU
@pytest.mark.parametrize("clock, found", [(0.55, True), (0.80, True), (0.90, False), (0.97, False)])
def test_a_throttled_gpu_is_found_from_its_clock_near_and_far_from_the_bound(clock: float, found: bool) -> None:
    """Rank 5's GEMMs keep their time (β unchanged): only its clock and throttle reason show it.
    Far (0.55) and near (0.80) below the 85% bound found; near (0.90) and far (0.97) above not."""
    sets = _job(1, clock={5: clock}, reason={5: "thermal"})
    report = localize(sets)
    hits = _findings(report, GPU_CLOCK_KEY)
    if not found:
        assert hits == [] and not any(5 in f.ranks and f.category is Category.COMPUTE for f in report.findings)
        return
    assert len(hits) == 1 and hits[0].ranks == (5,)
    facts = parse_clock_label(hits[0].label)
    assert facts is not None and facts.max_clock_ghz == pytest.approx(1.98)
    assert facts.clock_ghz == pytest.approx(clock * 1.98, abs=0.06)
    assert facts.reasons == ("thermal slowdown",)
    assert hits[0].sentence.startswith(f"rank 5: GPU at {facts.clock_ghz:.2f} of 1.98 GHz (thermal slowdown)")
    assert report.findings[0].key == GPU_CLOCK_KEY  # the only cause in the job, so the headline


def test_a_throttled_gpu_whose_gemms_run_longer_is_one_finding_with_both() -> None:
    sets = _job(2, clock={3: 0.56}, reason={3: "power"}, gemm_ns={3: 5_400_000})
    report = localize(sets)
    on3 = [f for f in report.findings if 3 in f.ranks]
    assert on3 and all(f.category is Category.COMPUTE for f in on3)
    facts = parse_clock_label(on3[0].label)
    assert on3[0].key == GPU_CLOCK_KEY and facts is not None and facts.clock_ghz == pytest.approx(0.56 * 1.98, abs=0.06)
    assert on3[0].sentence.startswith(f"rank 3: GPU at {facts.clock_ghz:.2f} of 1.98 GHz")
    assert "(power cap)" in on3[0].sentence
    assert f"also compute kernel {GEMM} 1.8× as long" in on3[0].sentence  # its symptom, the same culprit
    assert "wait for it" in on3[0].sentence  # the peers' waits are the clock's
    assert all(f.ranks == (3,) for f in report.findings if f.category is Category.COMPUTE)


def test_a_reason_without_a_low_clock_is_no_finding() -> None:
    """A software clock setting held on one rank while its clock stays at 97%: evidence, no finding."""
    report = localize(_job(3, clock={2: 0.97}, reason={2: "sw"}))
    assert report.findings == () or all(2 not in f.ranks for f in report.findings)
    assert not any(f.key.startswith(reason_key("")) for f in report.findings)


# ---------------------------------------------------- a slow InfiniBand port in one group
@pytest.mark.parametrize("wait, found", [(0.60, True), (0.30, True), (0.05, False), (0.0, False)])
def test_a_slow_infiniband_port_inside_one_group_is_found_near_and_far(wait: float, found: bool) -> None:
    """One group of 8 ranks on 8 hosts: a slow link slows the all-reduce of every member alike
    (every rank's β grows the same), so only rank 2's port_xmit_wait says which link it is."""
    sets = _job(4, local_world_size=1, allreduce_ns=4_000_000, xmit_wait={2: wait})
    assert all(p.resource == "nic" for ps in sets for p in ps.patterns if p.key == ALLREDUCE)
    report = localize(sets)
    hits = _findings(report, IB_WAIT_KEY)
    if not found:
        assert hits == [] and not any(2 in f.ranks for f in report.findings if f.category is Category.COLLECTIVE)
        return
    assert len(hits) == 1 and hits[0].ranks == (2,)
    assert "InfiniBand port stalled" in hits[0].sentence
    assert report.findings[0].key == IB_WAIT_KEY


# ------------------------------------------------------------------------ a PCIe fallback
def test_a_pcie_fallback_inside_a_host_is_found_on_that_rank_only() -> None:
    """One host of 8 GPUs: rank 6's peer traffic goes over PCIe (its NVLink is down), and the ring's
    all-reduce is slower on every member alike; the link that carried rank 6's traffic says which."""
    sets = _job(5, allreduce_ns=3_500_000, link={6: "pcie"}, link_util={6: 0.9})
    by_rank = {ps.rank: {p.key: p for p in ps.patterns} for ps in sets}
    assert by_rank[6][ALLREDUCE].resource == "pcie" and by_rank[0][ALLREDUCE].resource == "nvlink"
    assert by_rank[6][P2P_PCIE_KEY].mu > 0.9 and by_rank[0][P2P_PCIE_KEY].mu < 0.05
    report = localize(sets)
    hits = _findings(report, P2P_PCIE_KEY)
    assert len(hits) == 1 and hits[0].ranks == (6,)
    assert "went over PCIe, not NVLink" in hits[0].sentence
    assert report.findings[0].key == P2P_PCIE_KEY
    assert not any(r != 6 for f in report.findings if f.category is Category.COLLECTIVE for r in f.ranks)


def test_the_fallback_twin_nvlink_everywhere_is_no_finding() -> None:
    sets = _job(5, allreduce_ns=3_500_000)
    assert all(p.resource == "nvlink" for ps in sets for p in ps.patterns if p.key == ALLREDUCE)
    report = localize(sets)
    assert not any(f.category is Category.COLLECTIVE for f in report.findings)


# --------------------------------------------------------------- the link per collective
def test_the_link_of_a_collective_follows_its_group_and_hosts() -> None:
    inside, across = [[0, 1, 2, 3]], [[0, 4]]
    assert link_series(None, inside, 4, 0) == ("nvlink", "pcie")
    assert link_series(None, across, 4, 0) == ("nic",)
    assert link_series(None, [[0, 1], [0, 4]], 4, 0) == ("nic",)  # one of its groups spans hosts
    assert link_series(None, inside, 0, 0) == ("nvlink", "nic")  # layout unknown: as before
    assert link_series(None, [], 4, 0) == ("nvlink", "nic")  # groups unknown: as before


def test_without_hardware_series_the_health_patterns_are_absent() -> None:
    ps = summarize_window(_window(0, 3_000_000, 2_000_000, N), None)
    assert not any(p.key in (GPU_CLOCK_KEY, IB_WAIT_KEY) for p in ps.patterns)
    ps2 = summarize_window(dataclasses.replace(_window(0, 3_000_000, 2_000_000, N)),
                           SampleSet({"sm": _series("sm", np.full(WINDOW_NS // PERIOD_NS, 0.5))}))
    assert not any(p.key in (GPU_CLOCK_KEY, IB_WAIT_KEY) for p in ps2.patterns)


def test_the_worker_records_its_ranks_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from perftracker.runtime.window.writer import _local_world_size

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert _local_world_size() == 8
    for bad in ("", "eight", "-2"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        assert _local_world_size() == 0  # unknown: collectives measured as before
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert _local_world_size() == 0


def test_health_patterns_stay_out_of_a_ranks_own_work_and_idle_time() -> None:
    """The clock, reason and link patterns repeat their category's β; counted as work they shrank the
    idle share ("nothing on the critical path") and hid a host stall in the GPU fault bench."""
    from perftracker.localizer.diagnose.evidence.cpu_starvation import own_functions
    from perftracker.localizer.diagnose.evidence.host_bound import with_idle_share
    from perftracker.localizer.diagnose.method.arrays import pattern_sets_to_arrays

    from perftracker.model.hardware import is_health

    with_hw = _job(6, local_world_size=1, clock={1: 0.5}, reason={1: "thermal"})
    assert sum(is_health(p.key) for p in with_hw[0].patterns) >= 5  # clock, 3 reasons, port
    without = [dataclasses.replace(ps, patterns=tuple(p for p in ps.patterns if not is_health(p.key)))
               for ps in with_hw]
    arr_a, idle_a = with_idle_share(pattern_sets_to_arrays(with_hw))
    arr_b, idle_b = with_idle_share(pattern_sets_to_arrays(without))
    assert idle_a is not None and idle_b is not None
    np.testing.assert_allclose(arr_a.values[idle_a, 0, :], arr_b.values[idle_b, 0, :])
    assert not any(is_health(arr_a.functions[f].key) for f in own_functions(arr_a.functions))


# ------------------------------------------------------------------- what a throttled clock costs
@pytest.mark.parametrize("excess, expected", [
    (0.0, 0.0),  # kernels kept their time at 0.55 of the clock: found, and costs nothing
    (-0.01, 0.0),  # the rank computes less than its peers: nothing
    (0.01, 0.01),  # a little longer: the measured excess, not the clock's 0.045
    (0.15, 0.1125),  # kernels ~1.8x as long, and more: the clock's estimate, 0.25 x 0.45
])
def test_a_throttled_clock_costs_no_more_than_the_ranks_compute_excess(excess: float, expected: float) -> None:
    from perftracker.localizer.diagnose.evidence.health import health_excess

    from perftracker.model import Triple

    median = Triple(0.10, 0.98, 0.01)
    observed = Triple(0.10 + excess, 0.98 * 0.55, 0.01)
    by_clock = observed.beta * (1 - 0.55)
    assert by_clock >= expected - 1e-9
    assert health_excess(GPU_CLOCK_KEY, observed, median) == pytest.approx(expected, abs=1e-9)


def test_a_throttled_gpu_whose_gemms_keep_their_time_is_found_and_costs_nothing() -> None:
    """The twin of the 1.8x case above: the same clock and reason, GEMMs unchanged: found, no saving."""
    report = localize(_job(1, clock={5: 0.55}, reason={5: "thermal"}))
    hits = _findings(report, GPU_CLOCK_KEY)
    assert len(hits) == 1 and hits[0].ranks == (5,) and hits[0].saves_share < 0.005
    sets = _job(2, clock={3: 0.56}, reason={3: "power"}, gemm_ns={3: 5_400_000})
    # without step records (an older worker's upload): the clock's estimate
    old = localize([dataclasses.replace(ps, step_record=None) for ps in sets])
    on3 = _findings(old, GPU_CLOCK_KEY)
    assert len(on3) == 1 and on3[0].saves_share > 0.1 and on3[0].saves_basis == "an estimate"
    # with them, the replay: every step of this fixture is 10 ms and rank 3's 7.8 ms of GEMM and
    # all-reduce fit in it, so no one waits for its slower GEMMs and fixing its clock saves nothing
    on3 = _findings(localize(sets), GPU_CLOCK_KEY)
    assert len(on3) == 1 and on3[0].saves_share < 0.005
