"""A real 2-rank gloo DDP job for summarizer tests, run with torchrun.

Every rank runs ``busy_fn`` (a pure-Python loop) and ``sleepy_fn`` (time.sleep) each iteration;
rank ``SLOW_RANK`` also sleeps ``SLEEP_MS`` per iteration in ``straggle``. The profiled iterations
are exported as Kineto JSON (``OUT/rank{r}.json``) with Python stacks, and a schedstat sampler
process (tests.schedstat_sampler) records the training thread's CPU use (``OUT/samples{r}.npz``).
``perftracker.sync:<monotonic ns>`` annotations tie the trace clock to CLOCK_MONOTONIC.
``OUT/busy{r}.json`` holds busy_fn's true CPU share over the profiled iterations, counted both ways
(tests/cpuclock.py): thread_time and, where perf is permitted, the thread's task-clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from tests.cpuclock import ThreadCpuClock

OUT = os.environ["OUT"]
SLEEP_MS = float(os.environ.get("SLEEP_MS", "5"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "1"))
ITERS = int(os.environ.get("ITERS", "22"))
SYNC_POINTS = 16


def busy_fn(n: int = 60_000) -> int:
    acc = 0
    for i in range(n):  # no calls inside: one Python event, all self time
        acc += i * i
    return acc


def sleepy_fn(ms: float = 2.0) -> None:
    time.sleep(ms / 1000)


def straggle() -> None:
    time.sleep(SLEEP_MS / 1000)


def sync_points() -> None:
    """SYNC_POINTS annotations named after CLOCK_MONOTONIC just before each enters. Several, because a
    preemption between reading the clock and entering makes a point late; the reader
    (tests/accuracy/test_victims.py, sync_points) takes the earliest of each group."""
    for _ in range(SYNC_POINTS):
        with record_function(f"perftracker.sync:{time.monotonic_ns()}"):
            pass


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    clock = ThreadCpuClock()
    busy_ns = [0, 0, 0]  # wall, thread_time, task-clock of busy_fn (the profiled iterations only)

    def step() -> None:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        w0, (c0, p0) = time.monotonic_ns(), clock.read()
        busy_fn()
        w1, (c1, p1) = time.monotonic_ns(), clock.read()
        busy_ns[0] += w1 - w0
        busy_ns[1] += c1 - c0
        busy_ns[2] += (p1 - p0) if p0 is not None and p1 is not None else 0
        sleepy_fn()
        if rank == SLOW_RANK and SLEEP_MS > 0:
            straggle()

    for _ in range(5):
        step()
    if os.environ.get("MODE") == "online":
        online_window(rank, step)
        dist.destroy_process_group()
        return
    sampler = subprocess.Popen(
        [sys.executable, "-m", "tests.schedstat_sampler", str(os.getpid()), str(threading.get_native_id()),
         os.path.join(OUT, f"samples{rank}.npz")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert sampler.stdout is not None and sampler.stdout.readline().strip() == "ready"
    dist.barrier()
    busy_ns[:] = [0, 0, 0]
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        sync_points()
        for _ in range(ITERS):
            step()
        sync_points()  # and at the end: the trace clock may drift from CLOCK_MONOTONIC
    assert sampler.stdin is not None
    sampler.stdin.close()
    sampler.wait(timeout=30)
    prof_path = os.path.join(OUT, f"rank{rank}.json")
    # export_chrome_trace after the sampler stopped: its cost is not in the window
    prof.export_chrome_trace(prof_path)
    with open(os.path.join(OUT, f"busy{rank}.json"), "w") as fh:
        json.dump({"thread_time_share": busy_ns[1] / busy_ns[0],
                   "task_clock_share": busy_ns[2] / busy_ns[0] if clock.has_perf else None}, fh)
    dist.barrier()
    dist.destroy_process_group()


def online_window(rank: int, step: Callable[[], None]) -> None:
    """perftracker's own online path: ProfileWindow (Kineto ops + stack sampler + GC) and the
    perftracker.agent.samplers process; copies its RawWindow and SampleSet files to OUT."""
    import shutil
    import socket

    from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult

    ident = SimpleNamespace(rank=rank, world_size=dist.get_world_size(), host=socket.gethostname(), pid=os.getpid(),
                            training_tid=threading.get_native_id(), job="summarizer-test", local_rank=rank)
    win = ProfileWindow(ident, OUT, options=WindowOptions(stacks="sample", spawn_sampler=True))
    done: list[WindowResult] = []
    assert win.arm("online", float(os.environ.get("WINDOW_S", "0.6")), done.append)
    iteration = 0
    flag = torch.zeros(1)
    while True:
        step()
        iteration += 1
        win.on_boundary(time.monotonic_ns(), iteration)
        flag.fill_(1.0 if done else 0.0)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank steps until every window is written
        if flag.item() > 0:
            break
    res = done[0]
    assert not res.error and res.raw_path is not None, res.error
    shutil.copy(res.raw_path, os.path.join(OUT, f"online_raw{rank}.npz"))
    if res.samples_path is not None:
        shutil.copy(res.samples_path, os.path.join(OUT, f"online_samples{rank}.npz"))
    with open(os.path.join(OUT, f"online_iters{rank}.txt"), "w") as fh:
        fh.write(str(res.iterations))


if __name__ == "__main__":
    main()
