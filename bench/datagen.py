"""Data-generation cost of a profile window: ours against torch.profiler.profile(with_stack=True).

    python bench/datagen.py --window-s 20 --runs 3 [--layout shared|pinned]

Runs a CPU DDP training loop (gloo, 2 processes unless --nproc 1) and, on every rank in lockstep:
  1. before:   --before-s of plain training (reference iteration time);
  2. ours:     one ProfileWindow of --window-s (Kineto ops + stack sampler + GC + sampler process),
               from arm() until its file is written; blocking = the main-thread time of the
               boundary call that ends the window;
  3. after:    --after-s of plain training, starting once the window's file is written;
  4. baseline: --before-s of plain training, then torch.profiler.profile(with_stack=True) for
               --window-s, then export_chrome_trace (blocking = __exit__ + export on the main
               thread), then --after-s of plain training;
  5. tracer:   (with --tracer) our window with torch's Python tracer instead of the stack sampler,
               the other candidate for Python stacks (its blocking is reported as tracer_blocking_s).
Phase ends are agreed through a one-element all_reduce every iteration, in every phase alike.

**The whole cost** (``lost_s``): every iteration is timed start to start (the boundary call, the
profiler's start and stop included). From the window's arm() (ours) or the profiler's __enter__
(standard path) until the job is back to its baseline iteration time, lost = sum of (iteration
time - the median iteration time of the plain phase just before). "Back to baseline": the first
iteration of the after phase from which the median of the next RECOVER_N iterations is within
RECOVER_TOL of that median (if none, the whole after phase counts and ``recovered`` is false).
``lost_ratio`` = ours / standard path. ``--runs N`` repeats the whole run N times (a fresh job
each) and reports the median and the range of each figure.

Layouts (``--layout``): ``shared``: no pinning, training and perftracker's helpers share the cores.
``pinned``: every training rank pinned to CPU 0 (``sched_setaffinity``, as ``taskset -c 0``), and
perftracker's helpers (sampler process, writer, stack sampler, conversion child) on the other CPUs
(``WindowOptions.helper_cpus``): a node with a spare core, as GPU nodes have.

Rank 0 reports. Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("PERFTRACKER_DISABLE", "1")  # we drive the window ourselves, no detector

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult  # noqa: E402


def note(msg: str) -> None:
    print(f"[datagen] {msg}", file=sys.stderr, flush=True)


class Synthetic(Dataset):
    """Pre-generated samples behind a Python __getitem__ (as a decoded in-memory dataset)."""

    def __init__(self, n: int, dim: int) -> None:
        self.n = n
        self.x = torch.randn(4096, dim)
        self.y = self.x[:, :8].sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = i % len(self.x)
        return self.x[j], self.y[j]


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.norm(self.fc(x)))


class Net(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.model = Net(args.dim, args.depth)
        if dist.is_initialized():
            self.model = DDP(self.model)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.loader = DataLoader(Synthetic(10**9, args.dim), batch_size=args.batch)
        self.it = iter(self.loader)
        self.iteration = 0

    def step(self) -> None:
        x, y = next(self.it)
        loss = nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.iteration += 1


def agree(flag: bool, all_ranks: bool = False) -> bool:
    """True on every rank as soon as one rank (all ranks, with ``all_ranks``) says so."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN if all_ranks else dist.ReduceOp.MAX)
    return bool(t.item())


def plain(tr: Trainer, seconds: float) -> list[float]:
    """Iteration times (start to start) of ``seconds`` of plain training."""
    times: list[float] = []
    t_end = time.monotonic() + seconds
    t0 = time.perf_counter()
    while True:
        tr.step()
        stop = agree(time.monotonic() >= t_end)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
        if stop:
            return times


RECOVER_N = 5  # back to baseline: the median of the next RECOVER_N iterations ...
RECOVER_TOL = 0.05  # ... is within 5 % of the baseline median


def lost(base_s: float, cost: list[float], after: list[float]) -> tuple[float, bool, int]:
    """Training time lost: sum of (iteration - base) over ``cost`` (the window and its writing)
    and over ``after`` until it is back to baseline. Returns (lost_s, recovered, after iterations counted)."""
    total = sum(t - base_s for t in cost)
    for i in range(len(after)):
        if statistics.median(after[i:i + RECOVER_N]) <= base_s * (1 + RECOVER_TOL) and len(after) - i >= RECOVER_N:
            return total + sum(t - base_s for t in after[:i]), True, i
    return total + sum(t - base_s for t in after), False, len(after)


def ours(tr: Trainer, args: argparse.Namespace, out_dir: Path, session: str, stacks: str, spawn: bool) -> dict:
    ident = type("Ident", (), {"rank": int(os.environ.get("RANK", 0)), "world_size": args.nproc, "host": socket.gethostname(),
                               "pid": os.getpid(), "training_tid": threading.get_native_id(), "job": "datagen",
                               "local_rank": int(os.environ.get("RANK", 0))})()
    kw = {"stacks": stacks, "spawn_sampler": spawn, "stack_period_us": args.stack_period_us, "writer": args.writer,
          "sampler_args": tuple(args.sampler_args.split())}
    if args.converge:  # issue 30: end the window once its phases converged (older code: no such option)
        kw["converge"] = True
    own_pinning = "helper_cpus" in WindowOptions.__dataclass_fields__  # older code: the bench pins the sampler
    if own_pinning:
        kw["helper_cpus"] = tuple(args.helper_cpus)
    win = ProfileWindow(ident, out_dir, options=WindowOptions(**kw))
    done: list[WindowResult] = []
    t_arm = time.perf_counter()
    assert win.arm(session, args.window_s, done.append)
    cur = win._cur
    if args.helper_cpus and not own_pinning and cur is not None and cur.sampler is not None:
        os.sched_setaffinity(cur.sampler.proc.pid, set(args.helper_cpus))
    armed: list[float] = []  # from arm() to the window's first boundary
    in_window: list[float] = []
    writing: list[float] = []
    blocking_s = 0.0
    t_stop = 0.0
    t0 = t_arm
    while True:
        state = win.state
        tr.step()
        t1 = time.perf_counter()
        win.on_boundary(time.monotonic_ns(), tr.iteration)
        t2 = time.perf_counter()
        if state == "active" and win.state != "active":
            blocking_s = t2 - t1
            t_stop = t2
        finished = agree(bool(done), all_ranks=True)
        t3 = time.perf_counter()
        {"armed": armed, "active": in_window}.get(state, writing).append(t3 - t0)
        t0 = t3
        if finished:
            break
    res = done[0]
    if res.error:
        raise RuntimeError(f"window failed: {res.error}")
    return {"armed": armed, "in_window": in_window, "writing": writing, "blocking_s": blocking_s,
            "write_s": time.perf_counter() - t_stop, "raw_bytes": res.raw_path.stat().st_size if res.raw_path else 0,
            "rows": res.rows, "samples": str(res.samples_path or "")}


def baseline(tr: Trainer, args: argparse.Namespace, out_dir: Path) -> dict:
    t0 = time.perf_counter()
    prof = torch.profiler.profile(with_stack=True)
    prof.__enter__()
    in_window: list[float] = []
    t_end = time.monotonic() + args.window_s
    while True:
        tr.step()
        stop = agree(time.monotonic() >= t_end)
        t1 = time.perf_counter()
        if stop:
            break
        in_window.append(t1 - t0)
        t0 = t1
    t1 = time.perf_counter()
    prof.__exit__(None, None, None)
    path = out_dir / f"baseline-rank{os.environ.get('RANK', 0)}.json"
    prof.export_chrome_trace(str(path))
    t2 = time.perf_counter()
    blocking_s = t2 - t1
    in_window.append(t2 - t0)  # the last iteration, with the blocking stop and export
    size = path.stat().st_size
    path.unlink()
    return {"in_window": in_window, "blocking_s": blocking_s, "trace_bytes": size}


def worker(rank: int, args: argparse.Namespace, port: int, out_dir: Path) -> None:
    os.environ["RANK"] = str(rank)
    if args.train_cpus:
        os.sched_setaffinity(0, set(args.train_cpus))
    if rank == 0:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[datagen] %(name)s: %(message)s")
    torch.set_num_threads(1)
    if args.nproc > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.nproc)
    tr = Trainer(args)
    log = note if rank == 0 else (lambda m: None)
    plain(tr, args.warmup_s)
    before = plain(tr, args.before_s)
    base_s = statistics.median(before)
    log(f"before: {len(before)} iterations, median {base_s * 1e3:.1f} ms")
    o = ours(tr, args, out_dir, f"datagen-{args.window_s:g}", args.stacks, True)
    log(f"ours: {len(o['armed'])} armed, {len(o['in_window'])} in window, {len(o['writing'])} writing; "
        f"blocking {o['blocking_s']:.3f} s, write {o['write_s']:.2f} s")
    after = plain(tr, args.after_s)
    o_lost, o_rec, o_n = lost(base_s, o["armed"] + o["in_window"] + o["writing"], after)
    log(f"after: {len(after)} iterations, median {statistics.median(after) * 1e3:.1f} ms; lost {o_lost:.2f} s")
    before_b = plain(tr, args.before_s)
    base_b = statistics.median(before_b)
    b = baseline(tr, args, out_dir)
    after_b = plain(tr, args.after_s)
    b_lost, b_rec, b_n = lost(base_b, b["in_window"], after_b)
    log(f"baseline: before median {base_b * 1e3:.1f} ms, blocking {b['blocking_s']:.2f} s, "
        f"trace {b['trace_bytes']} bytes; lost {b_lost:.2f} s")
    tracer = None
    if args.tracer:
        tracer = ours(tr, args, out_dir, f"datagen-tracer-{args.window_s:g}", "tracer", False)
        log(f"ours with torch's Python tracer: blocking {tracer['blocking_s']:.2f} s")
    if rank == 0:
        result = {
            "window_s": args.window_s,
            "lost_s": round(o_lost, 3),
            "baseline_lost_s": round(b_lost, 3),
            "lost_ratio": round(o_lost / b_lost, 4) if b_lost > 0 else None,
            "recovered": o_rec and b_rec,
            "after_iters_counted": [o_n, b_n],
            "blocking_s": round(o["blocking_s"], 4),
            "baseline_blocking_s": round(b["blocking_s"], 4),
            "blocking_ratio": round(o["blocking_s"] / b["blocking_s"], 4),
            "iter_ms_before": round(base_s * 1e3, 2),
            "baseline_iter_ms_before": round(base_b * 1e3, 2),
            "armed_iters": len(o["armed"]),
            "armed_ratio": round(statistics.median(o["armed"]) / base_s, 4) if o["armed"] else None,
            "in_window_ratio": round(statistics.median(o["in_window"]) / base_s, 4),
            "writing_ratio": round(statistics.median(o["writing"]) / base_s, 4) if o["writing"] else None,
            "after_window_ratio": round(statistics.median(after) / base_s, 4),
            "baseline_in_window_ratio": round(statistics.median(b["in_window"]) / base_b, 4),
            "write_s": round(o["write_s"], 3),
            "raw_bytes": int(o["raw_bytes"]),
            "raw_rows": o["rows"],
            "baseline_trace_bytes": b["trace_bytes"],
            "tracer_blocking_s": round(tracer["blocking_s"], 4) if tracer else None,
            "tracer_in_window_ratio": round(statistics.median(tracer["in_window"]) / base_s, 4) if tracer else None,
        }
        (out_dir / "result.json").write_text(json.dumps(result))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def one_run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="datagen-") as tmp:
        out_dir = Path(tmp)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if args.nproc > 1:
            mp.spawn(worker, args=(args, port, out_dir), nprocs=args.nproc, join=True)
        else:
            worker(0, args, port, out_dir)
        return json.loads((out_dir / "result.json").read_text())


SUMMARY = ("lost_s", "baseline_lost_s", "lost_ratio", "blocking_s", "baseline_blocking_s", "in_window_ratio",
           "writing_ratio", "baseline_in_window_ratio", "write_s", "iter_ms_before")


def summarize(runs: list[dict], args: argparse.Namespace) -> dict:
    """The median of each figure over the runs, its range, and every run."""
    out: dict = {"runs_n": len(runs), "layout": args.layout, "window_s": args.window_s, "nproc": args.nproc,
                 "stacks": args.stacks, "stack_period_us": args.stack_period_us, "writer": args.writer,
                 "sampler_args": args.sampler_args}
    for key in SUMMARY:
        vals = [r[key] for r in runs if r.get(key) is not None]
        out[key] = round(statistics.median(vals), 4) if vals else None
        out[f"{key}_range"] = [min(vals), max(vals)] if vals else None
    out["recovered_all"] = all(r["recovered"] for r in runs)
    out["load_1min"] = [r.get("load_1min") for r in runs]
    out["runs"] = runs
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window-s", type=float, default=20.0)
    p.add_argument("--runs", type=int, default=3, help="repeat the whole run; median and range reported")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--before-s", type=float, default=4.0)
    p.add_argument("--after-s", type=float, default=6.0)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--layout", choices=("shared", "pinned"), default="shared")
    p.add_argument("--stacks", choices=("sample", "remote", "tracer", "off"), default="sample", help="our window's Python stacks")
    p.add_argument("--stack-period-us", type=int, default=WindowOptions.stack_period_us)
    p.add_argument("--writer", default=WindowOptions.writer, help="WindowOptions.writer for our window")
    p.add_argument("--tracer", action="store_true", help="also run our window with torch's Python tracer")
    p.add_argument("--converge", action="store_true",
                   help="end our window once its phases converged (WindowOptions.converge, PERFTRACKER_WINDOW_CONVERGE)")
    p.add_argument("--sampler-args", default="", help="extra arguments for the sampler process, e.g. '--period-us 4000'")
    args = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    args.train_cpus, args.helper_cpus = [], []
    if args.layout == "pinned":
        if len(cpus) < 2:
            p.error("--layout pinned needs 2 CPUs")
        args.train_cpus, args.helper_cpus = cpus[:1], cpus[1:]
    runs = []
    for i in range(args.runs):
        load0 = os.getloadavg()[0]
        r = one_run(args)
        r["load_1min"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        note(f"run {i + 1}/{args.runs}: {json.dumps(r)}")
        runs.append(r)
    print(json.dumps(summarize(runs, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
