"""A thread that alternates a pure-Python busy loop with time.sleep (a sibling thread burns CPU
outside the GIL all along), sampled by one real sampler process per variant side by side; each
phase timed by the thread's own CPU clocks (tests/cpuclock.py). Used by
tests/component/test_samplers.py (the fallback to schedstat when perf is refused) and
tests/accuracy/test_cpu_sources.py (how closely each CPU source tracks the thread's true share)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from perftracker.model.raw_window import SampleSet, UtilSeries

REPO = Path(__file__).resolve().parents[1]

ALTERNATING_CHILD = textwrap.dedent("""\
    # A thread alternating a pure-Python busy loop and time.sleep, timing each phase with its own
    # CPU clocks (thread_time_ns; perf task-clock where permitted, -1 elsewhere: tests/cpuclock.py)
    # next to CLOCK_MONOTONIC; a sibling thread burns CPU outside the GIL (hashlib) all along, so a
    # per-process counter would not read 0 in the sleeps.
    import hashlib, sys, threading, time
    from tests.cpuclock import ThreadCpuClock
    n, busy_ms, nap_ms = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    stop = threading.Event()
    def burn():
        buf = bytes(1 << 22)
        while not stop.is_set():
            hashlib.sha256(buf).digest()
    def work(start_ns):
        while time.monotonic_ns() < start_ns:
            time.sleep(0.001)
        clock = ThreadCpuClock()
        rows = []
        def now():
            c, p = clock.read()
            return time.monotonic_ns(), c, (-1 if p is None else p)
        for _ in range(n):
            w0, c0, p0 = now()
            while time.monotonic_ns() - w0 < busy_ms * 1e6:
                pass
            w1, c1, p1 = now()
            time.sleep(nap_ms / 1000)
            w2, c2, p2 = now()
            rows += [f"busy {w0} {w1} {c1 - c0} {p1 - p0 if p0 >= 0 else -1}",
                     f"sleep {w1} {w2} {c2 - c1} {p2 - p1 if p0 >= 0 else -1}"]
        print("\\n".join(rows), flush=True)
        print("done", flush=True)
    threading.Thread(target=burn, daemon=True).start()
    ready, go = threading.Event(), threading.Event()
    tid, start = [], []
    def runner():
        tid.append(threading.get_native_id())
        ready.set()
        go.wait()
        work(start[0])
        stop.wait()  # stay alive until the parent has stopped its samplers
    w = threading.Thread(target=runner)
    w.start()
    ready.wait()
    print(tid[0], flush=True)
    start.append(int(sys.stdin.readline()))
    go.set()
    while sys.stdin.readline():
        pass
    stop.set()
    w.join()
    """)


Phase = tuple[str, int, int, float, float]  # kind, w0, w1, thread_time share, task-clock share (nan: no perf)


def phase_estimates(cpu: UtilSeries, phases: list[Phase]) -> dict[str, np.ndarray]:
    """Per phase: (true share, the series' mean over exactly [w0, w1], mean of samples fully inside).

    The true share is counted as the series' source counts it (tests/cpuclock.py): the thread's own
    task-clock for perf, its thread_time for schedstat.
    """
    t = cpu.t_ns
    v = cpu.value.astype(np.float64)
    t_prev = np.r_[t[0] - cpu.period_ns, t[:-1]]
    out: dict[str, list[tuple[float, float, float]]] = {"busy": [], "sleep": []}
    for kind, w0, w1, sched_share, perf_share in phases:
        share = perf_share if cpu.source == "perf" else sched_share
        assert not np.isnan(share), "a perf series but no task-clock truth"
        overlap = np.clip(np.minimum(t, w1) - np.maximum(t_prev, w0), 0, None)
        inside = (t_prev >= w0) & (t <= w1)
        out[kind].append((share, float((overlap * v).sum() / (w1 - w0)), float(v[inside].mean()) if inside.sum() >= 5 else np.nan))
    return {k: np.array(x) for k, x in out.items()}


def drop_caps_for_perf() -> None:
    """preexec_fn: take CAP_PERFMON and CAP_SYS_ADMIN out of the bounding set, so that the exec'd
    process (root or not) holds neither: perf_event_open is then refused when paranoid >= 2."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (38, 21):  # CAP_PERFMON, CAP_SYS_ADMIN
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")


def perf_refusal_can_be_forced() -> bool:
    try:
        paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    except (OSError, ValueError):
        return False
    return os.geteuid() == 0 and paranoid >= 2


def run_side_by_side(tmp_path: Path, variants: dict[str, tuple[list[str], object]], n: int = 24,
                      busy_ms: int = 40, nap_ms: int = 40) -> tuple[dict[str, UtilSeries], list[Phase], dict[str, str]]:
    """Run one sampler process per variant (extra args, preexec_fn) on the same alternating thread."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PERFTRACKER_DISABLE": "1"}
    child = subprocess.Popen([sys.executable, "-c", ALTERNATING_CHILD, str(n), str(busy_ms), str(nap_ms)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        assert child.stdout is not None and child.stdin is not None
        tid = int(child.stdout.readline())
        far = time.monotonic_ns() + 3600 * 10**9
        for name, (args, preexec) in variants.items():
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "perftracker.agent.samplers", "--pid", str(child.pid), "--tid", str(tid), "--start-ns", str(far),
                 "--end-ns", str(far), "--out", str(tmp_path / f"{name}.npz"), "--samplers", "procfs", "--control-stdin", *args],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                preexec_fn=preexec)  # type: ignore[arg-type]
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        start = time.monotonic_ns() + 150_000_000  # samplers poll their start every 50 ms
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.write(f"start {start}\n")
            p.stdin.flush()
        child.stdin.write(f"{start + 30_000_000}\n")
        child.stdin.flush()
        phases: list[Phase] = []
        for line in child.stdout:
            if line.strip() == "done":
                break
            kind, a, b, c, p = line.split()
            wall = int(b) - int(a)
            phases.append((kind, int(a), int(b), int(c) / wall, int(p) / wall if int(p) >= 0 else float("nan")))
        end = time.monotonic_ns()
        logs: dict[str, str] = {}
        for name, p in procs.items():
            assert p.stdin is not None
            p.stdin.write(f"end {end}\n")
            p.stdin.flush()
            _, logs[name] = p.communicate(timeout=60)  # closes stdin: the sampler stops at once
            assert p.returncode == 0, logs[name]
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        child.kill()
        child.wait()
    series = {}
    for name in variants:
        cpu = SampleSet.load(tmp_path / f"{name}.npz").get("cpu")
        assert cpu is not None and len(cpu.t_ns) >= 0.6 * (phases[-1][2] - phases[0][1]) / 1e6
        series[name] = cpu
    assert len(phases) == 2 * n
    return series, phases, logs
