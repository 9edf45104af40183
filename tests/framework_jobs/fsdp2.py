"""FSDP2 (torch.distributed.fsdp.fully_shard per layer, AdamW) under torchrun, 2 CPU ranks (gloo).

A plain user script but for `import perftracker` (tests/integration/test_parallel_stacks.py). Rank
SLOW_RANK does extra matrix products in its forward from optimizer step SLOW_FROM on (the injected fault).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import perftracker  # noqa: F401  - the only perftracker line


class Net(torch.nn.Module):
    def __init__(self, slow: bool, slow_from: int, extra: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(256, 256) for _ in range(3)])
        self.head = torch.nn.Linear(256, 1)
        self.slow, self.slow_from, self.extra, self.calls = slow, slow_from, extra, 0
        self.register_buffer("w", torch.randn(512, 512) / 512 ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.slow and self.calls > self.slow_from:
            y = self.w
            for _ in range(self.extra):  # the fault: extra compute on one rank
                y = torch.tanh(y @ self.w)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=100)
    p.add_argument("--extra", type=int, default=4)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net(rank == args.slow_rank, args.slow_from, args.extra)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    data = torch.utils.data.TensorDataset(torch.randn(args.steps * 16, 256, generator=gen),
                                          torch.randn(args.steps * 16, 1, generator=gen))
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
