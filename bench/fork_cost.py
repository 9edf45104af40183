"""What forking the conversion child costs a large training process (issue 30).

A process with GIB GiB of touched host memory (``np.ones``) and a torch MLP training loop: a plain
phase, a profiled phase (Kineto on, as a window), then the profiler is stopped and a child is
forked that converts the result (``kineto_rows`` at SCHED_IDLE / nice 19, as
``WindowWriter.fork``); while it lives the loop goes on. Then the same with a child that only
sleeps as long (copy-on-write and page tables without the child's CPU). Each step optionally
writes WRITE_MB of the big buffer, a new region each step (the worst case for copy-on-write).
Reported: the fork() call's wall and CPU time, minor page faults per step with and without a
child, and the training thread's CPU time per step (``time.thread_time``: the host's load does
not enter it).

Usage: PERFTRACKER_DISABLE=1 python bench/fork_cost.py GIB WRITE_MB [PHASE_S]
e.g. ``bench/fork_cost.py 8 0`` and ``bench/fork_cost.py 8 64``. One JSON line.
"""
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from perftracker.runtime.profiler import KinetoCapture, kineto_rows  # noqa: E402
from perftracker.runtime.window.writer import _lower_priority  # noqa: E402


def main() -> None:
    gib, write_mb = float(sys.argv[1]), int(sys.argv[2])
    phase_s = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    torch.manual_seed(0)
    torch.set_num_threads(1)
    t = time.monotonic()
    big = np.ones(int(gib * (1 << 30)) // 8, np.float64)  # every page written once: touched
    touch_s = time.monotonic() - t
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    stride = (write_mb << 20) // 8
    pos = [0]
    faults: dict[str, float] = {}

    def step() -> float:
        t0 = time.thread_time()
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        if stride:  # one write per 4 KiB page over write_mb, a new region each step
            p = pos[0]
            big[p:p + stride:512] += 1.0
            pos[0] = (p + stride) % (len(big) - stride)
        return time.thread_time() - t0

    def phase(seconds: float, until: Callable[[], bool] | None = None, tag: str = "") -> list[float]:
        out: list[float] = []
        end = time.monotonic() + seconds
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        while time.monotonic() < end and (until is None or until()):
            out.append(step())
        if tag:
            faults[tag] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / max(len(out), 1)
        return out

    def with_child(pid: int, tag: str) -> tuple[list[float], float]:
        def alive() -> bool:
            return os.waitpid(pid, os.WNOHANG)[0] == 0

        t0 = time.monotonic()
        steps = phase(300, alive, tag)
        return steps, time.monotonic() - t0

    plain = phase(phase_s)
    cap = KinetoCapture(cuda=False)
    cap.start()
    lo_ns = time.monotonic_ns()
    profiled = phase(phase_s)
    hi_ns = time.monotonic_ns()
    t = time.monotonic()
    res = cap.stop()
    stop_s = time.monotonic() - t
    t, c = time.monotonic(), time.thread_time()
    pid = os.fork()
    fork_s, fork_cpu_s = time.monotonic() - t, time.thread_time() - c
    if pid == 0:  # the conversion child, as WindowWriter.fork
        code = 1
        try:
            _lower_priority(0, 19, (), idle=True)
            code = 0 if len(kineto_rows(res, cap.offset_ns, 0, lo_ns, hi_ns)) else 2
        finally:
            os._exit(code)
    converting, child_s = with_child(pid, "converting_child")
    none1 = phase(child_s, tag="no_child")
    t = time.monotonic()
    pid2 = os.fork()
    fork_sleeper_s = time.monotonic() - t
    if pid2 == 0:
        time.sleep(child_s)
        os._exit(0)
    sleeping, _ = with_child(pid2, "sleeping_child")
    none2 = phase(child_s, tag="no_child_again")

    def med(v: list[float]) -> float:
        return statistics.median(v) * 1e3 if v else float("nan")

    base = med(none1 + none2)
    print(json.dumps({
        "touched_gib": gib, "touch_s": round(touch_s, 2), "write_mb_per_step": write_mb,
        "stop_s": round(stop_s, 3), "fork_s": round(fork_s, 4), "fork_cpu_s": round(fork_cpu_s, 4),
        "fork_sleeper_s": round(fork_sleeper_s, 4), "child_life_s": round(child_s, 2),
        "minflt_per_step": {k: round(v, 1) for k, v in faults.items()},
        "cpu_ms_plain": round(med(plain), 3), "cpu_ms_profiled": round(med(profiled), 3),
        "cpu_ms_no_child": round(base, 3), "cpu_ratio_converting": round(med(converting) / base, 3),
        "cpu_ratio_sleeping": round(med(sleeping) / base, 3),
        "mean_cpu_ratio_converting": round(statistics.mean(converting) / statistics.mean(none1 + none2), 3)}))


if __name__ == "__main__":
    main()
