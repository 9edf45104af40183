"""Data-generation cost of a profile window: ours against torch.profiler.profile(with_stack=True).

    python bench/datagen.py --window-s 20

Runs a CPU DDP training loop (gloo, 2 processes unless --nproc 1) and, on every rank in lockstep:
  1. before:   --before-s of plain training (reference iteration time);
  2. ours:     one ProfileWindow of --window-s (Kineto ops + stack sampler + GC + sampler process);
               blocking = the main-thread time of the boundary call that ends the window;
  3. after:    --after-s of plain training, starting once the window's file is written;
  4. baseline: torch.profiler.profile(with_stack=True) for --window-s, then export_chrome_trace;
               blocking = __exit__ + export on the main thread;
  5. tracer:   (unless --no-tracer) our window with torch's Python tracer instead of the stack sampler,
               the other candidate for Python stacks (its blocking is reported as tracer_blocking_s).
Phase ends are agreed through a one-element all_reduce every iteration, in every phase alike.
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

from perftracker.window import ProfileWindow, WindowOptions, WindowResult  # noqa: E402


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
    times: list[float] = []
    t_end = time.monotonic() + seconds
    while True:
        t0 = time.perf_counter()
        tr.step()
        times.append(time.perf_counter() - t0)
        if agree(time.monotonic() >= t_end):
            return times


def ours(tr: Trainer, args: argparse.Namespace, out_dir: Path, session: str, stacks: str, spawn: bool) -> dict:
    ident = type("Ident", (), {"rank": int(os.environ.get("RANK", 0)), "world_size": args.nproc, "host": socket.gethostname(),
                               "pid": os.getpid(), "training_tid": threading.get_native_id(), "job": "datagen",
                               "local_rank": int(os.environ.get("RANK", 0))})()
    win = ProfileWindow(ident, out_dir, options=WindowOptions(stacks=stacks, spawn_sampler=spawn))
    done: list[WindowResult] = []
    assert win.arm(session, args.window_s, done.append)
    in_window: list[float] = []
    writing: list[float] = []
    blocking_s = 0.0
    t_stop = 0.0
    while True:
        state = win.state
        t0 = time.perf_counter()
        tr.step()
        t1 = time.perf_counter()
        win.on_boundary(time.monotonic_ns(), tr.iteration)
        t2 = time.perf_counter()
        if state == "active":
            in_window.append(t1 - t0)
            if win.state != "active":
                blocking_s = t2 - t1
                t_stop = t2
        elif state == "finishing":
            writing.append(t1 - t0)
        if agree(bool(done), all_ranks=True):
            break
    res = done[0]
    if res.error:
        raise RuntimeError(f"window failed: {res.error}")
    return {"in_window": in_window, "writing": writing, "blocking_s": blocking_s, "write_s": time.perf_counter() - t_stop,
            "raw_bytes": res.raw_path.stat().st_size if res.raw_path else 0, "rows": res.rows,
            "samples": str(res.samples_path or "")}


def baseline(tr: Trainer, args: argparse.Namespace, out_dir: Path) -> dict:
    prof = torch.profiler.profile(with_stack=True)
    prof.__enter__()
    in_window: list[float] = []
    t_end = time.monotonic() + args.window_s
    while True:
        t0 = time.perf_counter()
        tr.step()
        in_window.append(time.perf_counter() - t0)
        if agree(time.monotonic() >= t_end):
            break
    t0 = time.perf_counter()
    prof.__exit__(None, None, None)
    path = out_dir / f"baseline-rank{os.environ.get('RANK', 0)}.json"
    prof.export_chrome_trace(str(path))
    blocking_s = time.perf_counter() - t0
    size = path.stat().st_size
    path.unlink()
    return {"in_window": in_window, "blocking_s": blocking_s, "trace_bytes": size}


def worker(rank: int, args: argparse.Namespace, port: int, out_dir: Path) -> None:
    os.environ["RANK"] = str(rank)
    if rank == 0:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[datagen] %(name)s: %(message)s")
    torch.set_num_threads(1)
    if args.nproc > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.nproc)
    tr = Trainer(args)
    log = note if rank == 0 else (lambda m: None)
    plain(tr, args.warmup_s)
    before = plain(tr, args.before_s)
    log(f"before: {len(before)} iterations, mean {statistics.mean(before) * 1e3:.1f} ms")
    o = ours(tr, args, out_dir, f"datagen-{args.window_s:g}", "sample", True)
    log(f"ours: {len(o['in_window'])} iterations in window, blocking {o['blocking_s']:.3f} s, write {o['write_s']:.2f} s")
    after = plain(tr, args.after_s)
    log(f"after: {len(after)} iterations, mean {statistics.mean(after) * 1e3:.1f} ms")
    b = baseline(tr, args, out_dir)
    log(f"baseline: blocking {b['blocking_s']:.2f} s, trace {b['trace_bytes']} bytes")
    tracer = None
    if not args.no_tracer:
        tracer = ours(tr, args, out_dir, f"datagen-tracer-{args.window_s:g}", "tracer", False)
        log(f"ours with torch's Python tracer: blocking {tracer['blocking_s']:.2f} s")
    if rank == 0:
        mean_before = statistics.mean(before)
        result = {
            "window_s": args.window_s,
            "blocking_s": round(o["blocking_s"], 4),
            "baseline_blocking_s": round(b["blocking_s"], 4),
            "blocking_ratio": round(o["blocking_s"] / b["blocking_s"], 4),
            "in_window_ratio": round(statistics.mean(o["in_window"]) / mean_before, 4),
            "after_window_ratio": round(statistics.mean(after) / mean_before, 4),
            "raw_bytes": int(o["raw_bytes"]),
            "nproc": args.nproc,
            "iter_ms_before": round(mean_before * 1e3, 2),
            "write_s": round(o["write_s"], 3),
            "writing_ratio": round(statistics.mean(o["writing"]) / mean_before, 4) if o["writing"] else None,
            "raw_rows": o["rows"],
            "baseline_in_window_ratio": round(statistics.mean(b["in_window"]) / mean_before, 4),
            "baseline_trace_bytes": b["trace_bytes"],
            "tracer_blocking_s": round(tracer["blocking_s"], 4) if tracer else None,
            "tracer_in_window_ratio": round(statistics.mean(tracer["in_window"]) / mean_before, 4) if tracer else None,
        }
        (out_dir / "result.json").write_text(json.dumps(result))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window-s", type=float, default=20.0)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--before-s", type=float, default=4.0)
    p.add_argument("--after-s", type=float, default=4.0)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--no-tracer", action="store_true", help="skip the Python-tracer variant of our window")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="datagen-") as tmp:
        out_dir = Path(tmp)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if args.nproc > 1:
            mp.spawn(worker, args=(args, port, out_dir), nprocs=args.nproc, join=True)
        else:
            worker(0, args, port, out_dir)
        result = json.loads((out_dir / "result.json").read_text())
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
