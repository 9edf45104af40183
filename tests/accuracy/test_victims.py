"""Real 2-rank torchrun (gloo) DDP job: victims are not blamed, and μ tells busy from sleeping.

Rank 1 sleeps SLEEP_MS per iteration. Rank 0 then waits for it inside the DDP reducer's
finalize, which the profiler records as self time of ``run_backward``; the summarizer must put
that time in the collective category. Both ranks also run a busy and a sleeping Python function
each iteration, with a procfs/perf thread-CPU sampler (tests.schedstat_sampler) beside them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from perftracker.agent.kineto import read_kineto_trace
from perftracker.agent.summarize.patterns import samples_inside
from perftracker.agent.summarize.summarizer import SummarizeOptions, summarize_window, window_frames
from perftracker.agent.summarize.victims import REDUCER_WAIT, reducer_wait_intervals

from perftracker.model import Category, PatternSet
from perftracker.model.raw_window import RawWindow, SampleSet, UtilSeries
from tests.conftest import REPO

SLEEP_MS = 50
ITERS = 22
ENGINE = "<built-in method run_backward of torch._C._EngineBase object>"


def _nice() -> None:
    # The μ assertions measure the job's own threads. On a shared, overloaded CI host a busy thread
    # gets a fraction of a core, so ask for priority for these few seconds; fine if not permitted.
    for inc in (-20, -10, -5):
        try:
            os.nice(inc)
            return
        except OSError:
            continue


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import socket

    out = tmp_path_factory.mktemp("ddp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OUT=str(out), SLEEP_MS=str(SLEEP_MS), ITERS=str(ITERS), SLOW_RANK="1",
               PERFTRACKER_DISABLE="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           str(REPO / "tests" / "ddp_profile_job.py")]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, preexec_fn=_nice)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def online_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job through perftracker's online window (ProfileWindow + perftracker.agent.samplers)."""
    import socket

    out = tmp_path_factory.mktemp("ddp-online")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OUT=str(out), SLEEP_MS=str(SLEEP_MS), SLOW_RANK="1", MODE="online", WINDOW_S="1.0",
               PERFTRACKER_DISABLE="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           str(REPO / "tests" / "ddp_profile_job.py")]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, preexec_fn=_nice)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_online_window_victim_is_not_blamed(online_job: Path) -> None:
    sets = {}
    for rank in (0, 1):
        raw = RawWindow.load(online_job / f"online_raw{rank}.npz")
        samples = SampleSet.load(online_job / f"online_samples{rank}.npz")
        assert raw.meta.source == "online" and samples.get("cpu") is not None
        sets[rank] = summarize_window(raw, samples)
    iters = int((online_job / "online_iters1.txt").read_text())
    ps0, ps1 = sets[0], sets[1]
    # rank 0 waits for rank 1's sleeps in collectives (the reducer's wait, and the job's own
    # per-step all_reduce), not in Python: the engine frame's self time stays small
    coll0 = sum(p.beta for p in ps0.patterns if p.category is Category.COLLECTIVE)
    engine0 = sum(p.beta for p in ps0.patterns if p.key.endswith("_engine_run_backward"))
    assert pattern(ps0, REDUCER_WAIT) and pattern(ps0, REDUCER_WAIT)[0].category is Category.COLLECTIVE
    assert coll0 >= 0.15 and engine0 * 3 < coll0, (coll0, engine0)
    straggle = next(p for p in ps1.patterns if p.key.endswith("straggle"))
    assert straggle.category is Category.PYTHON
    assert straggle.critical_ns / 1e6 == pytest.approx(iters * SLEEP_MS, rel=0.5)


_cache: dict[tuple[Path, int], tuple[RawWindow, SampleSet]] = {}


def busy_true_share(out: Path, rank: int, samples: SampleSet) -> float:
    """busy_fn's CPU share in the profiled iterations, by the clock the job's sampler used."""
    truth = json.loads((out / f"busy{rank}.json").read_text())
    cpu = samples.get("cpu")
    assert cpu is not None
    if cpu.source.startswith("perf"):
        return float(truth["task_clock_share"])
    return float(truth["thread_time_share"])


def load_rank(out: Path, rank: int) -> tuple[RawWindow, SampleSet]:
    if (out, rank) not in _cache:
        _cache[(out, rank)] = _load_rank(out, rank)
    return _cache[(out, rank)]


def _load_rank(out: Path, rank: int) -> tuple[RawWindow, SampleSet]:
    raw = read_kineto_trace(out / f"rank{rank}.json")
    # the job's "perftracker.sync:<monotonic ns>" annotations, before and after the profiled steps, tie
    # the sampler clock to the trace clock. Each reads the clock just before it enters, so each offset
    # is the true one plus the delay in between (a whole timeslice when the thread is preempted
    # there): the smallest of each group is the best, and the line through the two follows any drift.
    (m0, o0), (m1, o1) = sync_points(raw)
    cpu = SampleSet.load(out / f"samples{rank}.npz").get("cpu")
    assert cpu is not None and len(cpu.t_ns) > 100
    t = cpu.t_ns.astype(np.int64)
    offset = o0 + ((t - m0) * (o1 - o0) / max(m1 - m0, 1)).astype(np.int64)
    return raw, SampleSet({"cpu": UtilSeries("cpu", t + offset, cpu.value, cpu.period_ns, cpu.source)})


def sync_points(raw: RawWindow) -> tuple[tuple[int, int], tuple[int, int]]:
    """(CLOCK_MONOTONIC ns, trace clock minus it) at the best sync annotation before and after the steps."""
    pts = []
    for name_id, name in enumerate(raw.names):
        if name.startswith("perftracker.sync:"):
            mono = int(name.split(":")[1])
            pts += [(mono, int(raw.col("start_ns")[r]) - mono) for r in np.flatnonzero(raw.col("name_id") == name_id)]
    pts.sort()
    assert len(pts) >= 16, len(pts)
    half = len(pts) // 2
    return min(pts[:half], key=lambda p: p[1]), min(pts[half:], key=lambda p: p[1])


def samples_in(raw: RawWindow, samples: SampleSet, select: Callable[[str, str], bool]) -> np.ndarray:
    """The CPU samples whose interval lies inside the self time of the frames that ``select(name,
    parent's name)`` picks."""
    fr = window_frames(raw, SummarizeOptions())
    parent = fr.nesting.parent
    frames = np.flatnonzero([select(fr.names[int(n)], fr.names[int(fr.name_id[parent[i]])] if parent[i] >= 0 else "")
                             for i, n in enumerate(fr.name_id)])
    seg = np.isin(fr.segments.owner, frames)
    cpu = samples.get("cpu")
    assert cpu is not None
    _, inside = samples_inside(fr.segments.owner[seg], fr.segments.start_ns[seg], fr.segments.end_ns[seg], cpu)
    return np.asarray(cpu.value[inside], dtype=np.float64)


def pattern(ps: PatternSet, suffix: str) -> list:  # type: ignore[type-arg]
    return [p for p in ps.patterns if p.key.endswith(suffix)]


@pytest.mark.flaky(reruns=1)
def test_waiting_rank_is_not_blamed(job: Path) -> None:
    sets = {}
    for rank in (0, 1):
        raw, samples = load_rank(job, rank)
        sets[rank] = summarize_window(raw, samples)
    ps0, ps1 = sets[0], sets[1]
    wait0 = pattern(ps0, REDUCER_WAIT)[0]
    wait1 = pattern(ps1, REDUCER_WAIT)[0]
    assert wait0.category is Category.COLLECTIVE
    # rank 0 waits for rank 1's sleeps: most of the extra time lands in the collective wait
    extra_ms = (wait0.critical_ns - wait1.critical_ns) / 1e6
    # (rank 1 also waits for rank 0 at times on a loaded host, so ask for a clear part of it)
    assert extra_ms >= 0.3 * ITERS * SLEEP_MS, extra_ms
    assert wait0.executions == ITERS
    # it is not Python: the engine's own self time is small next to the wait
    engine0 = sum(p.beta for p in pattern(ps0, ENGINE))
    assert engine0 < 0.05 and engine0 * 5 < wait0.beta
    # the culprit is: rank 1's sleep holds its share of the window, in Python, idle
    straggle = next(p for p in ps1.patterns if "straggle" in p.key)
    assert straggle.category is Category.PYTHON
    assert straggle.critical_ns / 1e6 == pytest.approx(ITERS * SLEEP_MS, rel=0.5)
    # Idle: the ~1,000 CPU samples inside its sleeps read ~0. Its Algorithm-1 μ is no measure of that
    # (docs/summarizer.md, "μ of a mostly idle function"): executions without a nonzero sample add nothing
    # to μ, so one stray sample decides it. Under three busy loops beside the job, 1 of 22 executions
    # held one nonzero sample (0.99, the last of its 47) and μ read 0.995; it read 0.29 and 0.40 in
    # two full suites (2026-11-27); 0.0-0.003 otherwise.
    values = samples_in(raw, samples, lambda name, parent: name.endswith("sleep>") and parent.endswith("straggle"))
    assert len(values) >= 0.5 * ITERS * SLEEP_MS and float(values.mean()) <= 0.2, (len(values), values.mean())


def test_without_the_rule_the_victim_would_be_blamed(job: Path) -> None:
    raw, samples = load_rank(job, 0)
    off = summarize_window(raw, samples, SummarizeOptions(attribute_reducer_wait=False))
    assert not pattern(off, REDUCER_WAIT)
    assert sum(p.beta for p in pattern(off, ENGINE)) > 0.1


def test_the_attributed_wait_is_thread_idle_time(job: Path) -> None:
    raw, samples = load_rank(job, 0)
    start, end = reducer_wait_intervals(raw)
    assert len(start) == ITERS
    cpu = samples.get("cpu")
    assert cpu is not None
    t_prev = cpu.t_ns - cpu.period_ns
    inside = np.zeros(len(cpu.t_ns), dtype=bool)
    for s, e in zip(start, end, strict=True):
        inside |= (t_prev >= s) & (cpu.t_ns <= e)
    assert inside.sum() >= 0.5 * ITERS * SLEEP_MS  # 1 ms samples
    assert float(cpu.value[inside].mean()) < 0.2  # blocked, not computing


def algorithm1_by_hand(values: list[float], c: int) -> tuple[int, float, float]:
    """Longest run with nonzero ends and at most c consecutive zeros; plain loops, for cross-checking."""
    best = (0, 0.0, 0.0)
    n = len(values)
    for i in range(n):
        if values[i] <= 0:
            continue
        zeros = 0
        for j in range(i, n):
            zeros = zeros + 1 if values[j] <= 0 else 0
            if zeros > c:
                break
            if values[j] > 0 and j - i + 1 > best[0]:
                run = values[i : j + 1]
                m = sum(run) / len(run)
                best = (len(run), m, (sum((v - m) ** 2 for v in run) / len(run)) ** 0.5)
    return best


# One rerun (the job fixture is run again): in 1 of 3 quiet full suites on 2026-11-26 rank 0's
# samples inside the 2 ms sleeps read 0.72 on average, where 0.0-0.07 is usual; the file passed 3 of
# 3 runs alone right after. A trace-to-sampler clock step was the likeliest reading; the job now
# syncs the clocks at 16 points before and 16 after its steps and takes the best of each
# (sync_points: the first point was ~0.1 ms late in every run looked at, the others within 10 µs).
@pytest.mark.flaky(reruns=1)
def test_busy_function_mu_follows_its_cpu_share_and_sleeps_hold_idle_samples(job: Path) -> None:
    for rank in (0, 1):
        raw, samples = load_rank(job, rank)
        opts = SummarizeOptions()
        ps = summarize_window(raw, samples, opts)
        busy = pattern(ps, "busy_fn")[0]
        sleepy = next(p for p in ps.patterns if "sleepy_fn" in p.key and p.key.endswith("sleep>"))
        assert busy.category is Category.PYTHON and busy.resource == "cpu"
        # The thread sleeps there: the samples inside the sleeps read ~0 on average. Algorithm 1's μ
        # of the sleep itself is not ~0 and is not asserted: it averages only the executions that hold
        # a nonzero sample, and a 2 ms sleep holds at most one whole 1 ms sample, so the few with a
        # stray nonzero one make its μ (docs/summarizer.md, "μ of a mostly idle function"). Measured over
        # 8 runs of this job: 0.0, 0.026, 0.075, 0.159, 0.465, 0.516, 0.60, 0.64; on the CI host of
        # 2026-11-27 0.857, above busy_fn's 0.825.
        naps = samples_in(raw, samples, lambda name, parent: name.endswith("sleep>") and parent.endswith("sleepy_fn"))
        assert len(naps) >= 10, (rank, len(naps))
        # measured: ~28-31 samples inside the 2 ms sleeps per rank, mean 0.0-0.066 (busy_fn's samples
        # 0.86-0.89). A trace-to-sampler clock error of a millisecond would put busy time into the
        # sleeps and lift this well above 0.2.
        assert float(naps.mean()) <= 0.2, (rank, naps.mean())
        # μ ≈ busy_fn's true CPU share, counted as the sampler's source counts it (tests/cpuclock.py).
        # On a quiet host the share is ~0.97 and μ 0.86-0.89 (the sampler's staircase reads a little
        # low). A CI host with 10-20 % hypervisor steal and other jobs beside it gave μ 0.75: the
        # thread truly ran less there, so the bound follows the measured share, not a fixed 0.8.
        true_share = busy_true_share(job, rank, samples)
        assert true_share > 0.3, ("the machine is too loaded for this test to mean anything", true_share)
        assert busy.mu >= 0.8 * true_share, (rank, busy.mu, sleepy.mu, true_share)
        # cross-check μ and σ of busy_fn (no children: self time = execution) with a by-hand Algorithm 1
        nid = [i for i, n in enumerate(raw.names) if n.endswith("busy_fn")][0]
        rows = np.flatnonzero(raw.col("name_id") == nid)
        cpu = samples.get("cpu")
        assert cpu is not None
        t_prev = np.r_[cpu.t_ns[0] - cpu.period_ns, cpu.t_ns[:-1]]
        wd = wu = ws = 0.0
        all_inside = np.zeros(len(cpu.t_ns), dtype=bool)
        for r in rows:
            inside = (t_prev >= raw.col("start_ns")[r]) & (cpu.t_ns <= raw.col("end_ns")[r])
            all_inside |= inside
            n, m, sd = algorithm1_by_hand([float(v) for v in cpu.value[inside]], opts.max_zero_run)
            wd, wu, ws = wd + n, wu + n * m, ws + n * sd
        # μ ≈ 1 when the thread has the CPU: the loop never blocks (0.9 at least on a quiet host). On
        # the shared 2-core CI host (load 8-16) it is preempted, its real CPU share during busy_fn
        # drops, and μ must stay at least near that share (Algorithm 1 drops long preemptions).
        share = float(cpu.value[all_inside].mean())
        assert busy.mu >= min(0.9, 0.9 * share), (rank, busy.mu, share)
        assert busy.mu == pytest.approx(wu / wd, abs=1e-5)
        assert busy.sigma == pytest.approx(ws / wd, abs=1e-5)
