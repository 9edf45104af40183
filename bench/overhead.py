"""Overhead of always-on detection: the same training loop with perftracker off and on, interleaved.

One process, a real loop (DataLoader ``next`` -> forward -> backward -> ``Optimizer.step``), two
iteration sizes: tiny (about 1 ms) and realistic (about 50 ms). Off and on alternate *per
iteration* in ABBA order (off, on, on, off, ...): hooks are installed before an "on" iteration and
removed after it, outside the timing, with one Runtime that keeps tracking throughout. Alternating
per iteration rather than per block cancels the slow load swings of this shared machine.

The primary figure is the training thread's CPU time (``time.thread_time_ns``) per iteration: the
hooks cost CPU in the training thread, and on a shared 2-core machine wall time is dominated by
preemption. Ratio = trimmed mean(on) / trimmed mean(off) (the slowest 2 % of each side dropped);
``*_se`` is its standard error. Wall-time ratios are printed beside it.

``hook_ns`` is measured directly: the cost of one hook call on the tracking hot path (the
DataLoader wrapper, the step pre hook and the step post hook with the detector and slowdown rule
behind them), averaged over the three. ``ratio_*_from_hook_ns`` turns it into the expected ratio.

Usage: python bench/overhead.py [--rounds N] [--quick]
``per_iteration_ns`` splits the hot loop's cost per iteration (three hook calls) by component:
``hooks`` (the three hooks writing the event log), ``detector`` (the log fed every 20 ms: sequence
matching, durations, the slowdown rule) and ``bench_clock`` (this bench's stepping clock, four reads
per iteration, a Python call a real job does not make). The ABBA figures above are the real loop.

Last stdout line: {"ratio_1ms": float, "ratio_50ms": float, "hook_ns": float, "per_iteration_ns": {...}, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["PERFTRACKER_DISABLE"] = "1"  # no import-time activation: this script toggles it itself
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from perftracker.config import Config  # noqa: E402
from perftracker.runtime import hooks  # noqa: E402
from perftracker.runtime.runtime import Runtime  # noqa: E402


class Loop:
    """An endless real training loop of a given width; ``run(n)`` does n iterations."""

    def __init__(self, width: int, batch: int) -> None:
        data = TensorDataset(torch.randn(batch * 64, width), torch.randn(batch * 64, 1))
        self.loader = DataLoader(data, batch_size=batch, shuffle=False, drop_last=True)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
            torch.nn.ReLU(), torch.nn.Linear(width, 1),
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.it = iter(self.loader)

    def run(self, n: int) -> None:
        model, opt, mse = self.model, self.opt, torch.nn.functional.mse_loss
        for _ in range(n):
            try:
                x, y = next(self.it)
            except StopIteration:
                self.it = iter(self.loader)
                x, y = next(self.it)
            loss = mse(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def calibrate(target_ms: float, batch: int) -> tuple[Loop, float]:
    """Pick the width whose iteration takes about target_ms (thread CPU time)."""
    width = 16
    while True:
        loop = Loop(width, batch)
        loop.run(5)
        t0 = time.thread_time_ns()
        loop.run(20)
        ms = (time.thread_time_ns() - t0) / 20 / 1e6
        if ms >= target_ms or width >= 8192:
            return loop, ms
        width = int(width * max(1.1, min(2.0, (target_ms / ms) ** 0.5)))


def interleave(loop: Loop, rt: Runtime, pairs: int) -> dict[str, object]:
    """Per-iteration ABBA: each iteration runs alone with perftracker off or on, in the order
    off, on, on, off, ...; hooks are installed/removed between iterations, outside the timing."""
    times: dict[bool, list[int]] = {False: [], True: []}
    walls: dict[bool, list[int]] = {False: [], True: []}
    order = (False, True, True, False)
    for i in range(2 * pairs):
        on = order[i % 4]
        if on:
            rt.start()
        # one untimed iteration after each switch, on both sides: installing or removing the hooks
        # patches a class attribute and the optimizer hook dicts, which invalidates CPython's
        # specialized bytecode caches; the first iteration after a switch pays to rebuild them
        # (~20 µs measured), a cost a real job pays once, not per iteration
        loop.run(1)
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        loop.run(1)
        times[on].append(time.thread_time_ns() - c0)
        walls[on].append(time.perf_counter_ns() - w0)
        if on:
            rt.stop()

    def trimmed_mean(xs: list[int]) -> float:
        xs = sorted(xs)
        cut = len(xs) // 50  # drop the 2 % slowest (preemption, page faults) on both sides alike
        kept = xs[: len(xs) - cut]
        return sum(kept) / len(kept)

    off, on_ = trimmed_mean(times[False]), trimmed_mean(times[True])
    # standard error of the difference of means, relative to the off mean
    se = (statistics.pvariance(times[False]) / len(times[False]) + statistics.pvariance(times[True]) / len(times[True])) ** 0.5
    return {
        "ratio_cpu": on_ / off,
        "ratio_cpu_se": se / off,
        "ratio_wall": trimmed_mean(walls[True]) / trimmed_mean(walls[False]),
        "iteration_ms": off / 1e6,
        "added_ns_per_iteration": on_ - off,
    }


class _QuietSink:
    """Triggers are not what this benchmark measures: drop them (no log line in the loop)."""

    def on_trigger(self, reason: str, detail: object) -> None:
        pass

    def on_blocked(self, detail: object) -> None:
        pass


class SteppingClock:
    """The real monotonic clock plus an offset the microbenchmark advances by 1 ms per iteration,
    so the detector sees 1 ms iterations (as in training) instead of back-to-back hook calls."""

    def __init__(self) -> None:
        self.offset_ns = 0

    def now_ns(self) -> int:
        return time.monotonic_ns() + self.offset_ns


def measure_hook_ns(calls: int, parts: dict[str, float] | None = None) -> float:
    """Mean cost of one hook call (D wrapper, step pre, step post) on the tracking hot path. With
    ``parts``, the cost per iteration by component goes there (ns, warm, hot loop): the hooks alone
    (the event log written, never fed), the detector (feeding the log every 20 ms: sequence
    matching, durations, the slowdown rule; the rest of the total), and the bench's own stepping
    clock (four reads; a real job reads time.monotonic_ns, a C call)."""
    clock = SteppingClock()
    rt = Runtime(Config(autostart_agent=False, trigger_cooldown_s=1e9), clock=clock, sink=_QuietSink())

    def trivial(_self: object) -> None:
        return None

    wrapped = hooks._wrap_next(trivial)
    pre, post = hooks._step_pre, hooks._step_post
    rt.start()
    try:
        for _ in range(500):  # learn "D O" and fill the slowdown rule's reference
            clock.offset_ns += 1_000_000
            wrapped(None)
            pre(None, (), {})
            post(None, (), {})
        assert rt.detector.phase == "tracking", rt.detector.phase
        best_on = best_off = float("inf")
        for _ in range(7):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                clock.offset_ns += 1_000_000
                wrapped(None)
                pre(None, (), {})
                post(None, (), {})
            best_on = min(best_on, (time.perf_counter_ns() - t0) / calls)
            t0 = time.perf_counter_ns()
            for _ in range(calls):  # the same loop without perftracker: the bare call
                clock.offset_ns += 1_000_000
                trivial(None)
            best_off = min(best_off, (time.perf_counter_ns() - t0) / calls)
        if parts is not None:
            best_hooks = best_clock = float("inf")
            for _ in range(7):
                rt.due_ns = 1 << 62  # never due: the hooks write the log and nothing reads it
                t0 = time.perf_counter_ns()
                for _ in range(calls):
                    clock.offset_ns += 1_000_000
                    wrapped(None)
                    pre(None, (), {})
                    post(None, (), {})
                best_hooks = min(best_hooks, (time.perf_counter_ns() - t0) / calls)
                rt._events.clear()  # the unread log of this pass
                rt.due_ns = 0
                now = clock.now_ns
                t0 = time.perf_counter_ns()
                for _ in range(calls):
                    clock.offset_ns += 1_000_000
                    now()
                    now()
                    now()
                    now()
                best_clock = min(best_clock, (time.perf_counter_ns() - t0) / calls - best_off)
            parts["bench_clock"] = round(best_clock, 1)
            parts["hooks"] = round(best_hooks - best_off - best_clock, 1)
            parts["detector"] = round(best_on - best_hooks, 1)
    finally:
        rt.stop()
    return (best_on - best_off) / 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100, help="x100 pairs at 1 ms, x4 at 50 ms")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds = 8 if args.quick else args.rounds
    torch.set_num_threads(1)
    torch.manual_seed(0)

    # the always-on part only: hooks -> detector -> default sink (no agent channel)
    rt = Runtime(Config(autostart_agent=False, trigger_cooldown_s=1e9), sink=_QuietSink())
    parts: dict[str, float] = {}
    hook_ns = measure_hook_ns(20_000 if args.quick else 50_000, parts)
    print(f"hook call: {hook_ns:.0f} ns; per iteration by component (ns, warm): {parts}", file=sys.stderr, flush=True)

    results: dict[str, dict[str, object]] = {}
    for name, target_ms, batch, pairs in (("1ms", 1.0, 8, 100 * rounds), ("50ms", 50.0, 64, 4 * rounds)):
        loop, ms = calibrate(target_ms, batch)
        rt.start()
        loop.run(40)  # learn the sequence, fill the detector's reference
        rt.stop()
        print(f"[{name}] iteration ~{ms:.2f} ms CPU; {pairs} off/on pairs", file=sys.stderr, flush=True)
        results[name] = interleave(loop, rt, pairs)
        print(f"  {json.dumps(results[name])}", file=sys.stderr, flush=True)

    per_iter_ns = 3 * hook_ns
    out = {
        "ratio_1ms": round(float(results["1ms"]["ratio_cpu"]), 5),  # type: ignore[arg-type]
        "ratio_50ms": round(float(results["50ms"]["ratio_cpu"]), 5),  # type: ignore[arg-type]
        "hook_ns": round(hook_ns, 1),
        "per_iteration_ns": parts,
        "ratio_1ms_wall": round(float(results["1ms"]["ratio_wall"]), 5),  # type: ignore[arg-type]
        "ratio_50ms_wall": round(float(results["50ms"]["ratio_wall"]), 5),  # type: ignore[arg-type]
        "ratio_1ms_se": round(float(results["1ms"]["ratio_cpu_se"]), 5),  # type: ignore[arg-type]
        "ratio_50ms_se": round(float(results["50ms"]["ratio_cpu_se"]), 5),  # type: ignore[arg-type]
        "added_ns_per_iteration": {k: round(float(v["added_ns_per_iteration"])) for k, v in results.items()},  # type: ignore[arg-type]
        "iteration_ms": {k: round(float(v["iteration_ms"]), 3) for k, v in results.items()},  # type: ignore[arg-type]
        "ratio_1ms_from_hook_ns": round(1 + per_iter_ns / (float(results["1ms"]["iteration_ms"]) * 1e6), 5),  # type: ignore[arg-type]
        "ratio_50ms_from_hook_ns": round(1 + per_iter_ns / (float(results["50ms"]["iteration_ms"]) * 1e6), 5),  # type: ignore[arg-type]
        "rounds": rounds,
        "measure": "training-thread CPU time per iteration, off/on alternated per iteration (ABBA), 2% trimmed means",
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
