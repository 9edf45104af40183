"""Hugging Face Trainer (torchrun, 2 CPU ranks): a tiny GPT-2 built from a config, synthetic tokens.

A plain user script but for `import perftracker` (tests/accuracy/test_integrations.py). Rank SLOW_RANK does
extra matrix products in its forward from step SLOW_FROM on (the injected fault). No download:
the model comes from a config and the data is random tokens (run with HF_HUB_OFFLINE=1).
"""

import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import perftracker  # noqa: F401  - the only perftracker line


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=100)
    p.add_argument("--extra", type=int, default=2)
    p.add_argument("--out", default="hf-out")
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64))
    if rank == args.slow_rank:  # the fault: extra compute in this rank's forward from step slow_from
        w, calls = torch.randn(512, 512), [0]

        def slow(module: torch.nn.Module, inputs: object) -> None:
            calls[0] += 1
            if calls[0] > args.slow_from:
                y = w
                for _ in range(args.extra):
                    y = torch.tanh(y @ w)

        model.register_forward_pre_hook(slow)
    training = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=8,
                                 learning_rate=1e-3, logging_steps=10**6, save_strategy="no", report_to=[],
                                 use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0)
    Trainer(model=model, args=training, train_dataset=Tokens(args.steps * 16 + 64, 32, 512)).train()


if __name__ == "__main__":
    main()
