"""A DP2 x PP2 job on 4 gloo ranks: two pipeline stages (hand-written send/recv between each stage
pair in its own pipeline group) and a data-parallel all-reduce of the gradients within each stage's
data-parallel group. A plain user script but for `import perftracker` (tests/system/test_pp_dp_job.py).

Ranks: stage = rank % 2, replica = rank // 2; pipeline groups {0, 1} and {2, 3}, data-parallel
groups {0, 2} (stage 0) and {1, 3} (stage 1). Rank ``--slow-rank`` does extra matrix products in
each step from step ``--slow-from`` on (the injected fault); ``--slow-rank -1``: a clean job.
``--trace-dir D`` profiles steps [trace-from, trace-from + trace-steps) with torch.profiler and
exports each rank's Kineto trace as D/rank{r}.json (as a user would, for `perftracker analyze`).
``--progress-dir D`` writes each rank's step count to D/rank{r}.iter.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import perftracker  # noqa: F401  - the only perftracker line

WIDTH = 256


def stage_model(stage: int) -> torch.nn.Module:
    torch.manual_seed(stage)
    if stage == 0:
        return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1))


class Batches(torch.utils.data.Dataset):
    """Whole batches, each read with ``io_ms`` of waiting (as from storage): the ranks' compute then
    takes less than the host's cores, as on a GPU job whose host work is light."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch: int, io_ms: float) -> None:
        self.x, self.y, self.batch, self.io_ms = x, y, batch, io_ms

    def __len__(self) -> int:
        return len(self.x) // self.batch

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.io_ms / 1000)
        return self.x[i * self.batch:(i + 1) * self.batch], self.y[i * self.batch:(i + 1) * self.batch]


def extra_work(w: torch.Tensor, n: int) -> None:
    y = w
    for _ in range(n):  # the fault: extra compute on one rank
        y = torch.tanh(y @ w)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--work", type=int, default=20, help="matrix products per step on every rank (the base compute)")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--extra", type=int, default=20, help="extra matrix products per step on the slow rank")
    p.add_argument("--io-ms", type=float, default=20.0, help="waiting per batch read (storage)")
    p.add_argument("--trace-dir", default="")
    p.add_argument("--trace-from", type=int, default=10)
    p.add_argument("--trace-steps", type=int, default=12)
    p.add_argument("--progress-dir", default="")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "a DP2 x PP2 job: 4 ranks"
    stage, replica = rank % 2, rank // 2
    pp_groups = [dist.new_group([0, 1], group_desc="PIPELINE_PARALLEL_GROUP"),
                 dist.new_group([2, 3], group_desc="PIPELINE_PARALLEL_GROUP")]
    dp_groups = [dist.new_group([0, 2], group_desc="DATA_PARALLEL_GROUP"),
                 dist.new_group([1, 3], group_desc="DATA_PARALLEL_GROUP")]
    pp, dp = pp_groups[replica], dp_groups[stage]
    peer = rank + 1 if stage == 0 else rank - 1

    model = stage_model(stage)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1000 + replica)
    data = Batches(torch.randn(args.batch * 8, WIDTH, generator=g), torch.randn(args.batch * 8, 1, generator=g),
                   args.batch, args.io_ms)
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    w = torch.randn(WIDTH, WIDTH, generator=g) / WIDTH ** 0.5
    progress = Path(args.progress_dir) / f"rank{rank}.iter" if args.progress_dir else None
    prof = None
    step = 0
    while step < args.steps:
        for x, y in loader:
            if args.trace_dir and step == args.trace_from:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True)
                prof.start()
            extra_work(w, args.work)  # the stage's own compute besides the model
            if rank == args.slow_rank and step >= args.slow_from:
                extra_work(w, args.extra)
            if stage == 0:
                act = model(x)
                dist.send(act.detach(), peer, group=pp)
                grad = torch.empty_like(act)
                dist.recv(grad, peer, group=pp)
                act.backward(grad)
            else:
                inp = torch.empty(x.shape[0], WIDTH)
                dist.recv(inp, peer, group=pp)
                inp.requires_grad_(True)
                loss = torch.nn.functional.mse_loss(model(inp), y)
                loss.backward()
                dist.send(inp.grad, peer, group=pp)
            flat = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
            dist.all_reduce(flat, group=dp)
            offset = 0
            for q in model.parameters():
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q) / 2)
                offset += q.numel()
            opt.step()
            opt.zero_grad()
            step += 1
            if prof is not None and step == args.trace_from + args.trace_steps:
                prof.stop()
                Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(os.path.join(args.trace_dir, f"rank{rank}.json"))
                prof = None
            if progress is not None:
                progress.write_text(f"{step}\n")
            if step >= args.steps:
                break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
