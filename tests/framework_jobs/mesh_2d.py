"""A 2-D job on 4 CPU ranks (gloo): FSDP2 (fully_shard) over "dp" × tensor parallel (DTensor
ColwiseParallel/RowwiseParallel) over "tp", on init_device_mesh("cpu", (2, 2)).

A plain user script but for `import perftracker` (tests/integration/test_parallel_stacks.py). Rank
SLOW_RANK does extra matrix products in its forward from optimizer step SLOW_FROM on (the injected
fault): its TP partner waits for it in the TP group, the other TP pair in the DP group. With
--hang-at-step, rank SLOW_RANK stops in its forward there instead (a rank stopped inside a TP group).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import perftracker  # noqa: F401  - the only perftracker line


class Block(torch.nn.Module):
    def __init__(self, slow: bool, slow_from: int, extra: int, hang_at: int = 0) -> None:
        super().__init__()
        self.up = torch.nn.Linear(256, 512)
        self.down = torch.nn.Linear(512, 256)
        self.slow, self.slow_from, self.extra, self.calls, self.hang_at = slow, slow_from, extra, 0, hang_at
        self.w = torch.randn(512, 512) / 512 ** 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.slow and 0 < self.hang_at <= self.calls:
            time.sleep(3600)  # the hang: this rank stops inside its TP group's step
        if self.slow and self.calls > self.slow_from:
            y = self.w
            for _ in range(self.extra):  # the fault: extra compute on one rank
                y = torch.tanh(y @ self.w)
        return self.down(torch.relu(self.up(x)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=100)
    p.add_argument("--extra", type=int, default=4)
    p.add_argument("--hang-at-step", type=int, default=0)
    args = p.parse_args()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Block(rank == args.slow_rank, args.slow_from, args.extra, args.hang_at_step)
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    gen = torch.Generator().manual_seed(mesh["dp"].get_local_rank())  # one batch per DP replica
    data = torch.utils.data.TensorDataset(torch.randn(args.steps * 16, 256, generator=gen),
                                          torch.randn(args.steps * 16, 256, generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
