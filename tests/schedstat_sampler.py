"""A minimal procfs thread-CPU sampler for summarizer tests, independent of perftracker.agent.samplers.

``python -m tests.schedstat_sampler PID TID OUT [PERIOD_US]`` samples the thread every PERIOD_US
on CLOCK_MONOTONIC until its stdin closes, then writes a SampleSet with one "cpu" series.

The kernel charges a running thread's ``se.sum_exec_runtime`` (schedstat field 1) only at
scheduler ticks and context switches, so 1 ms deltas of a busy thread come in bursts (0, 0, 0,
3.7 ms, 0, ...). Each burst is spread back over the intervals since the previous charge in which
the thread's state (``/proc/.../stat`` field 3) was R, capped at 100% per interval: value i is then
the thread's on-CPU share of (t_{i-1}, t_i].

When the kernel allows it (root, or perf_event_paranoid <= 1), the sampler reads the thread's
``PERF_COUNT_SW_TASK_CLOCK`` counter instead: a read brings the count up to date, so each value is
exact and no reconstruction is needed.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import threading
import time

import numpy as np

from perftracker.model.raw_window import SampleSet, UtilSeries


def reconstruct(t_ns: np.ndarray, run_ns: np.ndarray, running: np.ndarray) -> np.ndarray:
    """Per-interval on-CPU share from bursty cumulative run time (see the module doc)."""
    length = np.diff(t_ns).astype(np.float64)
    delta = np.diff(run_ns).astype(np.float64)
    n = len(length)
    charged = np.flatnonzero(delta > 0)
    util = np.zeros(n)
    if len(charged) == 0:
        return util
    # interval k belongs to the charge at the first charged index >= k
    group = np.searchsorted(charged, np.arange(n), side="left")
    valid = group < len(charged)
    w = np.where(running[1:], length, 0.0)
    wsum = np.bincount(group[valid], weights=w[valid], minlength=len(charged))
    lsum = np.bincount(group[valid], weights=length[valid], minlength=len(charged))
    use_len = wsum[group[valid]] <= 0
    weight = np.where(use_len, length[valid], w[valid])
    total = np.where(use_len, lsum[group[valid]], wsum[group[valid]])
    alloc = delta[charged][group[valid]] * weight / np.maximum(total, 1.0)
    util[valid] = alloc / np.maximum(length[valid], 1.0)
    return np.clip(util, 0.0, 1.0)


def task_clock_fd(tid: int) -> int | None:
    """A perf_event fd counting the thread's on-CPU ns (x86_64 syscall 298), or None."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        attr = bytearray(128)
        struct.pack_into("IIQ", attr, 0, 1, 128, 1)  # PERF_TYPE_SOFTWARE, size, PERF_COUNT_SW_TASK_CLOCK
        buf = ctypes.create_string_buffer(bytes(attr), 128)
        fd = libc.syscall(298, buf, tid, -1, -1, 0)
        if fd < 0:
            return None
        os.read(fd, 8)
        return int(fd)
    except OSError:
        return None


def main() -> int:
    pid, tid, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    period_ns = int(sys.argv[4]) * 1000 if len(sys.argv) > 4 else 1_000_000
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    sched = os.open(f"/proc/{pid}/task/{tid}/schedstat", os.O_RDONLY)
    stat = os.open(f"/proc/{pid}/task/{tid}/stat", os.O_RDONLY)
    perf = task_clock_fd(tid) if sys.platform == "linux" and os.uname().machine == "x86_64" else None
    ts, runs, states = [], [], []
    nxt = time.monotonic_ns()
    print("ready", flush=True)
    while not stop.is_set():
        # On a loaded host this process can be preempted between reading the clock and the
        # counter; such a sample would pin CPU time to the wrong moment, so it is dropped (the
        # next sample's interval then covers the gap).
        t0 = time.monotonic_ns()
        if perf is not None:
            run = struct.unpack("Q", os.read(perf, 8))[0]
            running = True
        else:
            run = int(os.pread(sched, 128, 0).split()[0])
            raw = os.pread(stat, 512, 0)
            running = raw[raw.rindex(b")") + 2 : raw.rindex(b")") + 3] == b"R"
        t1 = time.monotonic_ns()
        if t1 - t0 <= 100_000:
            ts.append((t0 + t1) // 2)
            runs.append(run)
            states.append(running)
        nxt += period_ns
        delay = nxt - time.monotonic_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
    t = np.array(ts, dtype=np.int64)
    if perf is not None:
        util = np.clip(np.diff(np.array(runs, dtype=np.float64)) / np.maximum(np.diff(t), 1), 0, 1)
        SampleSet({"cpu": UtilSeries("cpu", t[1:], util.astype(np.float32), period_ns, "perf-task-clock")}).save(out)
        return 0
    util = reconstruct(t, np.array(runs, dtype=np.int64), np.array(states, dtype=bool)).astype(np.float32)
    SampleSet({"cpu": UtilSeries("cpu", t[1:], util, period_ns, "schedstat-test")}).save(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
