"""The wait for a core, measured on a live host: a real thread that shares a core with a busy process
waits for it about half the time, and a sleeping thread waits for nothing (the series, its intervals
and the summarizer's CPU-wait function on hand-built data: tests/unit/test_cpuwait.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from perftracker.agent.samplers.base import WindowBounds
from perftracker.agent.samplers.procfs import ProcfsSampler

MS = 1_000_000

_BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_real_thread_sharing_a_core_with_a_busy_process_waits_about_half_the_time() -> None:
    """Two busy processes pinned to one core: the sampled one runs about half the time and waits
    for the core the other half, and the sampler says so (a sleeping thread waits for nothing)."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    procs = [subprocess.Popen([sys.executable, "-c", _BUSY.format(s=4)]) for _ in range(2)]
    try:
        for p in procs:
            os.sched_setaffinity(p.pid, {cpu})
        time.sleep(0.3)
        sampler = ProcfsSampler(procs[0].pid, procs[0].pid)
        assert sampler.unavailable_reason() is None
        now = time.monotonic_ns()
        bounds = WindowBounds(now + 100 * MS, now + 1600 * MS)
        series = sampler.run(bounds)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    inside = (series["cpu_wait"].t_ns > bounds.start_ns) & (series["cpu_wait"].t_ns <= bounds.end_ns)
    wait_share = float(series["cpu_wait"].value[inside].mean())
    run_share = float(series["cpu"].value[(series["cpu"].t_ns > bounds.start_ns) & (series["cpu"].t_ns <= bounds.end_ns)].mean())
    assert 0.3 < wait_share < 0.7, (wait_share, run_share)
    assert wait_share + run_share == pytest.approx(1.0, abs=0.15)

    # a thread that sleeps is not waiting for a core
    stop = threading.Event()
    tid: list[int] = []

    def sleeper() -> None:
        tid.append(threading.get_native_id())
        while not stop.wait(0.01):
            pass

    th = threading.Thread(target=sleeper)
    th.start()
    try:
        while not tid:
            time.sleep(0.01)
        now = time.monotonic_ns()
        quiet = ProcfsSampler(os.getpid(), tid[0]).run(WindowBounds(now + 20 * MS, now + 520 * MS))
    finally:
        stop.set()
        th.join()
    assert float(quiet["cpu_wait"].value.mean()) < 0.05
