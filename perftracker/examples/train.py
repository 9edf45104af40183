"""A real DDP training job on CPU (gloo) with perftracker imported and fault-injection switches.

    torchrun --nproc_per_node 2 examples/train.py --iters 200
    python examples/train.py --iters 50                 # single process, no DDP

Faults (repeatable ``--fault KIND:key=value,...``; applied on ``--fault-ranks`` or the fault's own
``ranks=2+3`` key, from ``--fault-start-iter`` or the fault's own ``start_iter=`` key on; a
``--fault-start-iter`` written right after a ``--fault`` applies to that fault only):

    sleep:where=dataloader|forward|backward|optimizer,ms=5,every=1
    busy_python:where=forward,ms=5        an inefficient pure-Python loop
    compute:where=forward,frac=0.3        extra batched matmuls (aten::bmm) for 0.3x the rank's mean iteration time
                                          before the fault (or ms=5): a slow-compute rank
    copy:mb=64                            extra tensor copies in forward (memory ops)
    gc_stall:probability=0.1,ms=50        a full garbage collection over a large heap
    hang:at_iter=100                      sleep forever in forward
    raise:at_iter=100                     raise RuntimeError in forward (a crash)
    exit:at_iter=100,code=3               sys.exit(3) in forward
    oom:at_iter=100,mb=64                 allocate (and touch) mb MiB after mb MiB in forward until killed

``--checkpoint-every N --checkpoint-pause-s S`` pauses every rank like a checkpoint save (a real
``torch.save`` of the model, then sleep to S). ``--progress-dir D`` writes ``D/rank<R>.iter``
("<iteration> <pid>") after every iteration, for harnesses. At the end each rank prints what
perftracker learned: the iteration sequence and iteration times.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import perftracker  # noqa: F401  (import starts detection; PERFTRACKER_DISABLE=1 opts out)

FAULT_KINDS = {
    "sleep": {"where", "ms", "every"},
    "busy_python": {"where", "ms", "every"},
    "compute": {"where", "ms", "frac", "every"},
    "copy": {"mb", "every"},
    "gc_stall": {"probability", "ms"},
    "hang": {"at_iter"},
    "raise": {"at_iter"},
    "exit": {"at_iter", "code"},
    "oom": {"at_iter", "mb"},
}
COMMON_KEYS = {"ranks", "start_iter"}
WHERES = ("dataloader", "forward", "backward", "optimizer")


@dataclass
class Fault:
    kind: str
    params: dict[str, str]
    ranks: set[int] | None = None  # None: every rank
    start_iter: int = 0
    state: dict[str, object] = field(default_factory=dict)

    def num(self, key: str, default: float) -> float:
        return float(self.params.get(key, default))

    def where(self) -> str:
        where = self.params.get("where", "forward")
        if where not in WHERES:
            raise SystemExit(f"--fault {self.kind}: where={where!r} is not one of {', '.join(WHERES)}")
        return where


def parse_faults(argv: list[str], default_ranks: set[int] | None) -> list[Fault]:
    """Parse --fault/--fault-start-iter in order, so a start iteration can follow its fault."""
    faults: list[Fault] = []
    default_start = 0
    i = 0
    while i < len(argv):
        arg = argv[i]
        value = None
        if arg in ("--fault", "--fault-start-iter") and i + 1 < len(argv):
            value = argv[i + 1]
            i += 1
        elif arg.startswith(("--fault=", "--fault-start-iter=")):
            arg, value = arg.split("=", 1)
        i += 1
        if value is None:
            continue
        if arg == "--fault-start-iter":
            if faults and "start_iter" not in faults[-1].params and faults[-1].state.get("start_set") is None:
                faults[-1].start_iter = int(value)
                faults[-1].state["start_set"] = True
            else:
                default_start = int(value)
            continue
        kind, _, rest = value.partition(":")
        if kind not in FAULT_KINDS:
            raise SystemExit(f"--fault {value!r}: unknown kind {kind!r} (one of {', '.join(FAULT_KINDS)})")
        params: dict[str, str] = {}
        for item in filter(None, rest.split(",")):
            key, sep, val = item.partition("=")
            if not sep or key not in FAULT_KINDS[kind] | COMMON_KEYS:
                raise SystemExit(f"--fault {value!r}: bad parameter {item!r} for {kind}")
            params[key] = val
        ranks = default_ranks
        if "ranks" in params:
            ranks = {int(r) for r in params["ranks"].replace(";", "+").split("+") if r}
        fault = Fault(kind, params, ranks, int(params.get("start_iter", -1)))
        if "start_iter" in params:
            fault.state["start_set"] = True
        faults.append(fault)
    for f in faults:
        if f.start_iter < 0 or f.state.get("start_set") is None:
            f.start_iter = default_start if f.start_iter < 0 else f.start_iter
    return faults


class Injector:
    """Applies the active faults at their places in the training step."""

    def __init__(self, faults: list[Fault], rank: int, seed: int) -> None:
        self.faults = [f for f in faults if f.ranks is None or rank in f.ranks]
        self.rng = random.Random(seed * 1000 + rank)
        self.iteration = 0
        self._gc_heap: list[object] = []
        self._iter_t: list[float] = []  # perf_counter at each iteration end, for compute:frac=
        self.ran: dict[str, int] = {}  # "kind@where" -> times a fault ran (harness and test checks)

    def _active(self, f: Fault) -> bool:
        if self.iteration < f.start_iter:
            return False
        every = max(1, int(f.num("every", 1)))
        return (self.iteration - f.start_iter) % every == 0

    def at(self, where: str) -> None:
        for f in self.faults:
            if f.kind in ("sleep", "busy_python") and f.where() == where and self._active(f):
                self._count(f, where)
                if f.kind == "sleep":
                    time.sleep(f.num("ms", 5) / 1000)
                else:
                    busy_python_hotspot(f.num("ms", 5) / 1000)
            elif f.kind == "compute" and f.where() == where and self._active(f):
                self._count(f, where)
                busy_compute(f, self._iter_t)
            elif f.kind == "copy" and where == "forward" and self._active(f):
                self._count(f, where)
                extra_copies(f)
            elif f.kind == "hang" and where == "forward" and self.iteration >= int(f.num("at_iter", 0)):
                hang_forever()
            elif f.kind in ("raise", "exit", "oom") and where == "forward" \
                    and self.iteration >= int(f.num("at_iter", 0)):
                crash(f, self.iteration)

    def _count(self, f: Fault, where: str) -> None:
        key = f"{f.kind}@{where}"
        self.ran[key] = self.ran.get(key, 0) + 1

    def end_of_iteration(self) -> None:
        if len(self._iter_t) < 200 and any(f.kind == "compute" and self.iteration < f.start_iter for f in self.faults):
            self._iter_t.append(time.perf_counter())
        for f in self.faults:
            if f.kind == "gc_stall" and self.iteration >= f.start_iter:
                if self.rng.random() < f.num("probability", 0.1):
                    self._count(f, "end")
                    self._gc_stall(f)
        self.iteration += 1

    def _gc_stall(self, f: Fault) -> None:
        # grow a heap of live container objects until one full collection takes ~ms
        target_s = f.num("ms", 50) / 1000
        while True:
            t0 = time.perf_counter()
            gc.collect()
            took = time.perf_counter() - t0
            if took >= target_s * 0.8 or len(self._gc_heap) >= 4_000_000:
                return
            grow = max(50_000, len(self._gc_heap))
            self._gc_heap.extend([] for _ in range(grow))


def busy_python_hotspot(seconds: float) -> int:
    """An inefficient pure-Python loop (a Python hotspot on the critical path)."""
    end = time.perf_counter() + seconds
    acc = 0
    while time.perf_counter() < end:
        for i in range(200):
            acc = (acc * 31 + i) % 1_000_003
    return acc


def busy_compute(f: Fault, iter_t: list[float]) -> None:
    """Extra compute ops (aten::bmm) on the critical path for ms=, or frac= x the mean iteration time
    measured before the fault started (its last 50 iterations)."""
    if "frac" in f.params:
        seconds = f.state.get("seconds")
        if not isinstance(seconds, float):
            t = iter_t[-51:]
            seconds = f.num("frac", 0.3) * ((t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.01)
            f.state["seconds"] = seconds
    else:
        seconds = f.num("ms", 5) / 1000
    ab = f.state.get("ab")
    if not isinstance(ab, tuple):
        ab = f.state["ab"] = (torch.randn(4, 128, 128), torch.randn(4, 128, 128), torch.empty(4, 128, 128))
    a, b, c = ab
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.bmm(a, b, out=c)  # batched matmuls: compute ops of their own (aten::bmm)


def extra_copies(f: Fault) -> None:
    n = int(f.num("mb", 64) * (1 << 20) / 4)
    buf = f.state.get("buf")
    if not isinstance(buf, torch.Tensor) or buf.numel() != n:
        buf = torch.empty(n)
        f.state["buf"] = buf
    dst = buf.clone()
    dst.copy_(buf)


def crash(f: Fault, iteration: int) -> None:
    """The crash faults: an uncaught exception, an exit status, or allocating until the OOM killer."""
    if f.kind == "raise":
        raise RuntimeError(f"injected fault: raise at iteration {iteration}")
    if f.kind == "exit":
        sys.stdout.flush()
        sys.exit(int(f.num("code", 1)))
    hoard = []
    n = int(f.num("mb", 64)) * 2**20 // 4
    while True:  # under the harness's memory cgroup limit the OOM killer ends this
        hoard.append(torch.ones(n))


def hang_forever() -> None:
    while True:
        time.sleep(3600)


class SyntheticDataset(Dataset):
    """Deterministic random regression samples, built per item (real per-sample work)."""

    def __init__(self, size: int, in_dim: int, seed: int) -> None:
        self.size, self.in_dim, self.seed = size, in_dim, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + idx)
        x = torch.randn(self.in_dim, generator=g)
        return x, x[:1].tanh() + 0.1 * x[1:2]


class Collate:
    def __init__(self, injector: Injector) -> None:
        self.injector = injector

    def __call__(self, batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = zip(*batch, strict=True)
        return torch.stack(xs), torch.stack(ys)


class SlowBackward(torch.autograd.Function):
    """Identity in forward; runs the 'backward' faults during backward."""

    @staticmethod
    def forward(ctx, x, injector):
        ctx.injector = injector
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.injector.at("backward")
        return grad, None


class MLP(nn.Module):
    def __init__(self, in_dim: int, hidden: int, layers: int, injector: Injector) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:], strict=False))
        self.head = nn.Linear(hidden, 1)
        self.injector = injector

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.injector.at("forward")
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(x))
            if i == 0:
                # after the first layer: the input batch needs no gradient, so a Function applied to
                # it would never see a backward pass; here the 'backward' faults run mid-backward
                x = SlowBackward.apply(x, self.injector)
        return self.head(x)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description="DDP CPU training with perftracker and fault injection")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--in-dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    p.add_argument("--fault", action="append", default=[], help="KIND:key=value,... (repeatable)")
    p.add_argument("--fault-ranks", default="", help="comma-separated ranks the faults apply to")
    p.add_argument("--fault-start-iter", type=int, default=0, help="iteration at which faults begin")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--checkpoint-pause-s", type=float, default=1.0)
    p.add_argument("--progress-dir", default="")
    p.add_argument("--quiet", action="store_true", help="print only the final summary")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) >= 1 and "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1

    ranks = {int(r) for r in args.fault_ranks.split(",") if r.strip()} or None
    injector = Injector(parse_faults(argv, ranks), rank, args.seed)

    dataset = SyntheticDataset(size=max(256, args.batch_size * 64) * world, in_dim=args.in_dim, seed=args.seed)
    sampler: DistributedSampler[int] | None = (
        DistributedSampler(dataset, world, rank, seed=args.seed) if distributed else None)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        shuffle=sampler is None,
        num_workers=args.num_workers,
        collate_fn=Collate(injector),
        persistent_workers=args.num_workers > 0,
        drop_last=True,
    )
    model: nn.Module = MLP(args.in_dim, args.hidden, args.layers, injector)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    opt.register_step_pre_hook(lambda *_: injector.at("optimizer"))

    progress = Path(args.progress_dir) / f"rank{rank}.iter" if args.progress_dir else None
    if progress is not None:
        progress.parent.mkdir(parents=True, exist_ok=True)
    # with --progress-dir: every iteration's end time too (rank<R>.times, "<iteration> <monotonic ns>"),
    # so that a harness can study the iteration-time series the detector saw
    times = open(progress.with_suffix(".times"), "a", buffering=1) if progress is not None else None  # noqa: SIM115
    it, epoch = 0, 0
    t0 = time.perf_counter()
    while it < args.iters:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            injector.at("dataloader")
            loss = F.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            injector.end_of_iteration()
            if args.checkpoint_every and (it + 1) % args.checkpoint_every == 0:
                save_checkpoint(model, args.checkpoint_pause_s)
            if progress is not None:
                tmp = progress.with_suffix(".tmp")
                tmp.write_text(f"{it} {os.getpid()}\n")
                os.replace(tmp, progress)
            if times is not None:
                times.write(f"{it} {time.monotonic_ns()}\n")
            if not args.quiet and rank == 0 and (it + 1) % 50 == 0:
                _line(f"[rank 0] iteration {it + 1}/{args.iters} loss {loss.item():.4f}")
            it += 1
            if it >= args.iters:
                break
        epoch += 1
    elapsed = time.perf_counter() - t0
    if times is not None:
        times.close()
    print_summary(rank, world, args.iters, elapsed)
    if injector.faults:
        ran = " ".join(f"{k}={v}" for k, v in sorted(injector.ran.items())) or "none"
        _line(f"[rank {rank}] faults ran: {ran}")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def save_checkpoint(model: nn.Module, pause_s: float) -> None:
    """Like a checkpoint save: every rank serializes its state, then waits for the slow storage."""
    t0 = time.perf_counter()
    torch.save(model.state_dict(), io.BytesIO())
    time.sleep(max(0.0, pause_s - (time.perf_counter() - t0)))


def _items(value: object) -> list[Any]:
    """A list field of ``perftracker.status()`` (a dict of plain values)."""
    return list(value) if isinstance(value, (list, tuple)) else []


def print_summary(rank: int, world: int, iters: int, elapsed_s: float) -> None:
    st = perftracker.status()
    times = [round(float(t), 2) for t in _items(st.get("recent_iteration_ms"))]
    triggers = _items(st.get("triggers"))
    mean = st.get("recent_mean_ms")
    low = st.get("recent_min_ms")
    # one write per line: the ranks share torchrun's stdout pipe, and print() writes the text and
    # its newline separately, so two ranks' lines could run together
    _line(
        f"[rank {rank}/{world}] {iters} iterations in {elapsed_s:.1f} s; perftracker phase={st['phase']} "
        f"mode={st.get('mode')} iteration={st['iteration']} sequence={' '.join(_items(st['sequence']))}"
        + (f" recent mean={mean:.1f} ms min={low:.1f} ms" if mean is not None and low is not None else "")
        + f" triggers={len(triggers)}"
        + f" trigger_iterations={[t.get('iteration') for t in triggers]}"
    )
    if rank == 0 and times:
        _line(f"[rank 0] last {len(times)} iteration times (ms): {times}")


def _line(text: str) -> None:
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (text + "\n").encode())


if __name__ == "__main__":
    raise SystemExit(main())
