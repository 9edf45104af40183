"""A plain DDP loop over an IterableDataset with gradient accumulation 4 (torchrun, 2 CPU ranks).

The hooks see D D D D O per optimizer step. A plain user script but for `import perftracker`
(tests/accuracy/test_integrations.py). Rank SLOW_RANK does extra matrix products in its forward from
optimizer step SLOW_FROM on (the injected fault).
"""

import argparse
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import perftracker  # noqa: F401  - the only perftracker line

ACCUMULATE = 4


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __iter__(self):  # type: ignore[no-untyped-def]
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.n):
            yield torch.randn(256, generator=g), torch.randn(1, generator=g)


class Net(torch.nn.Module):
    def __init__(self, slow: bool, slow_from_calls: int, extra: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
        self.slow, self.slow_from, self.extra, self.calls = slow, slow_from_calls, extra, 0
        self.w = torch.randn(384, 384)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.slow and self.calls > self.slow_from:
            y = self.w
            for _ in range(self.extra):  # the fault: extra compute on one rank
                y = torch.tanh(y @ self.w)
        return self.body(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=60)
    p.add_argument("--extra", type=int, default=1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Net(rank == args.slow_rank, args.slow_from * ACCUMULATE, args.extra))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Stream(args.steps * ACCUMULATE * 8, seed=rank), batch_size=8)
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % ACCUMULATE == 0
        with contextlib.nullcontext() if last else model.no_sync():  # allreduce once per optimizer step
            loss = torch.nn.functional.mse_loss(model(x), y) / ACCUMULATE
            loss.backward()
        if last:
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
