"""One time base: profiler events and procfs samples line up on CLOCK_MONOTONIC.

A loop alternates a pure-Python busy function with a Python function that sleeps. The window
profiles it and the real sampler process (``python -m perftracker.agent.samplers``) samples the training
thread (perf task-clock where permitted, else schedstat; tests/accuracy/test_cpu_sources.py checks both
sources against the thread's own clocks). Inside each busy execution (found in the window's rows,
from the stack sampler and from a Kineto ``record_function`` annotation) the sampled CPU
utilization must match the thread's true CPU share for that call, counted as the source counts it
(its task-clock for perf, ``time.thread_time_ns`` for schedstat: tests/cpuclock.py), which is
~100 % on an idle machine; inside each sleep it must be ~0 %. Shifting the profiler times by a few
tens of ms must break the match.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from perftracker.model.raw_window import EventKind, RawWindow, SampleSet
from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult
from tests.cpuclock import ThreadCpuClock

BUSY_MS = 40
NAP_MS = 40


class _Ident:
    rank, world_size, local_rank, host, job = 0, 1, 0, "test", "timebase"
    pid = os.getpid()
    training_tid = threading.get_native_id()


def busy(ms: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < ms / 1000:
        pass


def nap(ms: float) -> None:
    time.sleep(ms / 1000)


def _mean_util_inside(cpu_t: np.ndarray, cpu_v: np.ndarray, start: int, end: int) -> float | None:
    # sample i covers (t[i-1], t[i]]: keep intervals fully inside the execution
    inside = (cpu_t > start + 1_500_000) & (cpu_t <= end - 500_000)
    return float(cpu_v[inside].mean()) if inside.sum() >= 5 else None


def _rows(raw: RawWindow, name_suffix: str, kind: EventKind) -> list[tuple[int, int]]:
    ids = [i for i, n in enumerate(raw.names) if n == name_suffix or n.endswith(": " + name_suffix)]
    sel = np.isin(raw.col("name_id"), ids) & (raw.col("kind") == kind)
    return list(zip(raw.col("start_ns")[sel].tolist(), raw.col("end_ns")[sel].tolist(), strict=True))


# One rerun: 40 ms phases of a real thread on a shared 2-core host; a full-suite run on 2026-11-26,
# during a stretch where a busy thread got only ~0.73 of a core, read 0.11 off. Tolerances unchanged.
# A CI host with 10-20 % hypervisor steal read perf 0.07 off thread_time: the truth is now counted
# as the sampler's source counts it.
@pytest.mark.flaky(reruns=1)
def test_busy_and_sleep_line_up_with_procfs_samples(tmp_path: Path) -> None:
    win = ProfileWindow(_Ident(), tmp_path, options=WindowOptions(spawn_sampler=True))
    done: list[WindowResult] = []
    assert win.arm("tb", 1.5, done.append)
    # (start, end, true cpu share) of each busy call, counted as the sampler's source counts it:
    # the thread's task-clock where perf is permitted (it includes hypervisor steal), else its
    # thread_time (tests/cpuclock.py)
    truth: list[tuple[int, int, float]] = []
    clock = ThreadCpuClock()
    truth_source = "perf" if clock.has_perf else "schedstat"
    it = 0
    deadline = time.monotonic() + 40
    try:
        while not done and time.monotonic() < deadline:
            w0, (c0, p0) = time.monotonic_ns(), clock.read()
            with torch.profiler.record_function("busy_op"):
                busy(BUSY_MS)
            w1, (c1, p1) = time.monotonic_ns(), clock.read()
            cpu_ns = p1 - p0 if p0 is not None and p1 is not None else c1 - c0
            truth.append((w0, w1, cpu_ns / (w1 - w0)))
            nap(NAP_MS)
            it += 1
            win.on_boundary(time.monotonic_ns(), it)
    finally:
        clock.close()
    assert done, "window never finished"
    res = done[0]
    assert res.error == "", res.error
    assert res.samples_path is not None and res.raw_path is not None
    raw = RawWindow.load(res.raw_path)
    cpu = SampleSet.load(res.samples_path).get("cpu")
    assert cpu is not None and len(cpu.t_ns) > 800  # >= ~1 kHz over 1.5 s (+ margins)
    assert cpu.t_ns[0] <= res.start_ns and cpu.t_ns[-1] >= res.end_ns  # samples cover the window

    busy_py = _rows(raw, "busy", EventKind.PYTHON)
    busy_op = _rows(raw, "busy_op", EventKind.ANNOTATION)
    naps = _rows(raw, "nap", EventKind.PYTHON)
    assert len(busy_py) >= 10 and len(busy_op) >= 10 and len(naps) >= 10
    # executions start and end when the calls did (stack sampling: to ~1 ms, plus GIL hand-over)
    def edge_errors_ms(rows: list[tuple[int, int]]) -> list[float]:
        out = []
        for s, e in rows:
            t = min(truth, key=lambda t: abs(t[0] - s))
            out.append(max(abs(t[0] - s), abs(t[1] - e)) / 1e6)
        return out

    assert np.median(edge_errors_ms(busy_py)) < 10.0  # 1 ms ticks idle; scheduler delay on a loaded node
    assert np.median(edge_errors_ms(busy_op)) < 1.0

    def errors(rows: list[tuple[int, int]], shift_ns: int) -> list[float]:
        out = []
        for s, e in rows:
            s, e = s + shift_ns, e + shift_ns
            match = [t for t in truth if abs(t[0] - (s - shift_ns)) < 5_000_000]
            u = _mean_util_inside(cpu.t_ns, cpu.value, s, e)
            if match and u is not None:
                out.append(abs(u - match[0][2]))
        return out

    true_busy = float(np.median([t[2] for t in truth]))
    assert true_busy > 0.05, "the machine is too loaded for this test to mean anything"
    # the exact perf task-clock where the kernel permits it, else the rebuilt schedstat staircase;
    # the truth counts what the source counts
    assert cpu.source == truth_source
    # record_function rows have exact edges; stack-sampled rows are ~1 ms (more under load) off.
    # The truth is each call's whole share, the samples cover its inside: when other load takes the
    # core away in timeslices of ms, the two differ more the less the thread ran, so the bound grows
    # by half the share it did not get. The CI host of 2026-11-27 (true share 0.71-0.77) gave
    # 0.085-0.133 against the flat 0.06; the shifted-clock control below still has to fail by
    # 0.5 of the share.
    load = 0.5 * max(0.0, 1.0 - true_busy)
    for rows, tol in ((busy_py, 0.12 + load), (busy_op, (0.06 if cpu.source == "perf" else 0.12) + load)):
        err = errors(rows, 0)
        assert len(err) >= 8
        print(f"timebase {cpu.source}: median |sampled - true| inside busy = {np.median(err):.3f}, true share {true_busy:.3f}")
        assert np.median(err) < tol, f"sampled CPU inside busy executions off by {np.median(err):.2f}"
        # the control: a clock off by one execution (into the sleeps) gives a large error
        assert np.median(errors(rows, BUSY_MS * 1_000_000)) > np.median(err) + 0.5 * true_busy
    nap_util = [u for s, e in naps if (u := _mean_util_inside(cpu.t_ns, cpu.value, s, e)) is not None]
    assert len(nap_util) >= 8
    assert np.median(nap_util) < 0.08, nap_util
    if true_busy > 0.9:  # an idle machine: the "about 100 %" holds literally
        busy_util = [_mean_util_inside(cpu.t_ns, cpu.value, s, e) for s, e in busy_op]
        assert np.median([u for u in busy_util if u is not None]) > 0.85
