"""A single-process, non-distributed training loop: `python single_process.py`.

A plain user script but for `import perftracker` (tests/accuracy/test_integrations.py). From step SLOW_FROM
on, its forward does extra matrix products (the injected fault, on rank 0: the only rank).
"""

import argparse

import torch

import perftracker  # noqa: F401  - the only perftracker line


class Net(torch.nn.Module):
    def __init__(self, slow_from: int, extra: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
        self.slow_from, self.extra, self.calls = slow_from, extra, 0
        self.w = torch.randn(512, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.slow_from:
            y = self.w
            for _ in range(self.extra):  # the fault: extra compute
                y = torch.tanh(y @ self.w)
        return self.body(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--slow-rank", type=int, default=0)  # (one rank only)
    p.add_argument("--slow-from", type=int, default=100)
    p.add_argument("--extra", type=int, default=1)
    args = p.parse_args()
    torch.manual_seed(0)
    model = Net(args.slow_from, args.extra)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(args.steps * 16, 256), torch.randn(args.steps * 16, 1))
    for x, y in torch.utils.data.DataLoader(data, batch_size=16, shuffle=True):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
