"""Pipeline parallel with torch.distributed.pipelining (ScheduleGPipe or Schedule1F1B) under torchrun,
one stage per rank (2 or 4 CPU ranks, gloo).

A plain user script but for `import perftracker` (tests/integration/test_parallel_stacks.py). The
stage on rank SLOW_RANK does extra matrix products in its forward from optimizer step SLOW_FROM on
(the injected fault); with --raise-at-step it raises there instead (a stage that crashes).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import perftracker  # noqa: F401  - the only perftracker line


class Stage(torch.nn.Module):
    def __init__(self, slow: bool, args: argparse.Namespace) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(256, 256)
        self.slow, self.args, self.calls, self.step = slow, args, 0, 0
        self.w = torch.randn(512, 512) / 512 ** 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.slow and self.step >= self.args.raise_at_step > 0:
            raise RuntimeError(f"stage failed at step {self.step}")  # the crash case
        if self.slow and self.step >= self.args.slow_from:
            y = self.w
            for _ in range(self.args.extra):  # the fault: extra compute on one stage
                y = torch.tanh(y @ self.w)
        return torch.relu(self.lin(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=100)
    p.add_argument("--extra", type=int, default=2)
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--raise-at-step", type=int, default=0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    module = Stage(rank == args.slow_rank, args)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    loss_fn = torch.nn.functional.mse_loss
    kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    schedule = kind(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(args.steps * 16, 256, generator=gen),
                                          torch.randn(args.steps * 16, 256, generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    for x, y in loader:
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        opt.step()
        module.step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
