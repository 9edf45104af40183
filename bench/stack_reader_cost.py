"""What reading the training thread's Python stack from outside costs the training process.

    python bench/stack_reader_cost.py [--phase-s 4] [--rounds 3]

One training process (datagen's MLP, one thread) trains while a reader process runs
perftracker/remote_stacks.py against it in phases, interleaved round by round: ``none`` (no
reader), ``rt_1ms`` (SCHED_RR, every 1 ms, as the sampler process runs), ``normal_1ms`` (nice 0),
``rt_4ms``, ``normal_4ms``, and ``thread_1ms`` / ``thread_4ms`` (no reader: the in-process
sampler thread, with the 1 ms switch interval). Reports each phase's median iteration time over ``none``'s. Progress on
stderr; last stdout line one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("PERFTRACKER_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

READER = r"""
import os, sys, time
from perftracker.remote_stacks import RemoteStackReader, StackLayout
pid, period_ns, rt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "rt"
if rt:
    os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(os.sched_get_priority_min(os.SCHED_RR)))
r = RemoteStackReader(pid, StackLayout.from_json(sys.stdin.readline()))
n = ok = 0
nxt = time.monotonic_ns()
t_cpu = time.process_time()
while sys.stdin.readable():
    ok += r.sample() is not None
    n += 1
    nxt += period_ns
    d = nxt - time.monotonic_ns()
    if d > 0:
        time.sleep(d / 1e9)
    else:
        nxt = time.monotonic_ns()
    if n % 200 == 0 and os.path.exists(sys.argv[4]):
        break
print(n, ok, r.torn, round((time.process_time() - t_cpu) / max(n, 1) * 1e6, 1), flush=True)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase-s", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    import torch

    from bench.datagen import Trainer
    from perftracker.remote_stacks import calibrate
    from perftracker.runtime import stack_sampler as stacks_mod

    torch.set_num_threads(1)
    tr = Trainer(argparse.Namespace(dim=512, depth=6, batch=64))
    layout = calibrate().to_json()
    phases = ("none", "rt_1ms", "normal_1ms", "rt_4ms", "normal_4ms", "thread_1ms", "thread_4ms")
    times: dict[str, list[float]] = {ph: [] for ph in phases}
    reader_us: dict[str, list[float]] = {}

    def train(seconds: float) -> list[float]:
        out = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            tr.step()
            out.append(time.perf_counter() - t0)
        return out

    train(2.0)  # warm-up
    stop_file = Path(f"/tmp/stack-reader-stop-{os.getpid()}")
    for rnd in range(args.rounds):
        for ph in phases:
            proc = sampler = None
            old_switch = sys.getswitchinterval()
            stop_file.unlink(missing_ok=True)
            if ph.startswith(("rt", "normal")):
                period = 1_000_000 if ph.endswith("1ms") else 4_000_000
                env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
                proc = subprocess.Popen([sys.executable, "-c", READER, str(os.getpid()), str(period),
                                         "rt" if ph.startswith("rt") else "normal", str(stop_file)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
                assert proc.stdin is not None
                proc.stdin.write(layout + "\n")
                proc.stdin.flush()
                time.sleep(0.5)
            elif ph.startswith("thread"):
                sys.setswitchinterval(0.001)
                sampler = stacks_mod.StackSampler(threading.get_ident(), 1000 if ph.endswith("1ms") else 4000)
                sampler.start()
            times[ph] += train(args.phase_s)
            if proc is not None:
                stop_file.touch()
                out, _ = proc.communicate(timeout=30)
                n, ok, torn, us = out.split()
                reader_us.setdefault(ph, []).append(float(us))
                print(f"[stack_reader_cost] round {rnd} {ph}: {n} reads, {ok} whole, {torn} torn, "
                      f"{us} us CPU/read", file=sys.stderr, flush=True)
            if sampler is not None:
                sampler.stop()
                sys.setswitchinterval(old_switch)
    stop_file.unlink(missing_ok=True)
    base = statistics.median(times["none"])
    result = {"iter_ms_none": round(base * 1e3, 2), "nproc_host": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)}
    for ph in phases[1:]:
        result[f"ratio_{ph}"] = round(statistics.median(times[ph]) / base, 4)
    for ph, us in reader_us.items():
        result[f"reader_cpu_us_per_read_{ph}"] = round(statistics.median(us), 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
