"""Lightning with its own DDP launcher: `python lightning_ddp.py`, Trainer(strategy="ddp", devices=2).

Rank 0 is this process, started before Lightning sets any distributed environment; Lightning
starts rank 1 itself. A plain user script but for `import perftracker` (tests/accuracy/test_integrations.py).
Rank SLOW_RANK does extra matrix products in its forward from step SLOW_FROM on (the injected fault).
"""

import argparse

import lightning as L
import torch

import perftracker  # noqa: F401  - the only perftracker line


class Model(L.LightningModule):
    def __init__(self, slow_rank: int, slow_from: int, extra: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
        self.slow_rank, self.slow_from, self.extra, self.calls = slow_rank, slow_from, extra, 0
        self.w = torch.randn(512, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.global_rank == self.slow_rank and self.calls > self.slow_from:
            y = self.w
            for _ in range(self.extra):  # the fault: extra compute on one rank
                y = torch.tanh(y @ self.w)
        return self.body(x)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=100)
    p.add_argument("--extra", type=int, default=1)
    args = p.parse_args()
    torch.manual_seed(0)
    n = args.steps * 16 * 2 + 64
    data = torch.utils.data.TensorDataset(torch.randn(n, 256), torch.randn(n, 1))
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(args.slow_rank, args.slow_from, args.extra), torch.utils.data.DataLoader(data, batch_size=16))


if __name__ == "__main__":
    main()
