"""Accelerate with a plain loop (torchrun, 2 CPU ranks): Accelerator(), prepare, accelerator.backward.

A plain user script but for `import perftracker` (tests/accuracy/test_integrations.py). Rank SLOW_RANK does
extra matrix products in its forward from step SLOW_FROM on (the injected fault).
"""

import argparse

import torch
from accelerate import Accelerator

import perftracker  # noqa: F401  - the only perftracker line


class Net(torch.nn.Module):
    def __init__(self, slow: bool, slow_from: int, extra: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
        self.slow, self.slow_from, self.extra, self.calls = slow, slow_from, extra, 0
        self.w = torch.randn(512, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.slow and self.calls > self.slow_from:
            y = self.w
            for _ in range(self.extra):  # the fault: extra compute on one rank
                y = torch.tanh(y @ self.w)
        return self.body(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=100)
    p.add_argument("--extra", type=int, default=1)
    args = p.parse_args()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = Net(accelerator.process_index == args.slow_rank, args.slow_from, args.extra)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n = args.steps * 16 * accelerator.num_processes
    data = torch.utils.data.TensorDataset(torch.randn(n, 256), torch.randn(n, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
    accelerator.end_training()


if __name__ == "__main__":
    main()
