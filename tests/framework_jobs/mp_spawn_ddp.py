"""DDP started with torch.multiprocessing.spawn: no torchrun, no RANK/WORLD_SIZE in the environment.

A plain user script but for `import perftracker` (tests/accuracy/test_integrations.py). Rank SLOW_RANK does
extra matrix products in its forward from step SLOW_FROM on (the injected fault).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import perftracker  # noqa: F401  - the only perftracker line


class Net(torch.nn.Module):
    def __init__(self, slow: bool, slow_from: int, extra: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                        torch.nn.ReLU(), torch.nn.Linear(256, 1))
        self.slow, self.slow_from, self.extra, self.calls = slow, slow_from, extra, 0
        self.w = torch.randn(512, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.slow and self.calls > self.slow_from:
            y = self.w
            for _ in range(self.extra):  # the fault: extra compute on one rank
                y = torch.tanh(y @ self.w)
        return self.body(x)


def worker(rank: int, world: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = DDP(Net(rank == args.slow_rank, args.slow_from, args.extra))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(args.steps * 32, 256), torch.randn(args.steps * 32, 1))
    sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=16, sampler=sampler)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=100)
    p.add_argument("--extra", type=int, default=4)
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    mp.spawn(worker, args=(2, args), nprocs=2)
