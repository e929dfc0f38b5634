"""Run under torchrun (or plainly, as one rank): one policy update of the tiny model on a fixed batch,
split over the ranks as the trainer splits it, then a checkpoint. Used by test_distributed.py.

    python -m torch.distributed.run --standalone --nproc-per-node 2 ranks_worker.py MODEL_DIR OUT_DIR [rank0-write]

``rank0-write``: rank 0 fails to write its checkpoint files (the other rank must not wait for it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from rollforge.models import load_model
from rollforge.train import checkpoint as ckpt
from rollforge.train.distributed import Ranks, full_state_dict, shard
from rollforge.train.losses import ClippedPolicyLoss, TokenMean
from rollforge.train.update import TrainedPolicy, UpdateRow, UpdateSettings, policy_update

GROUP = 4


def batch() -> tuple[list[UpdateRow], torch.Tensor]:
    """Two groups of four episodes of different lengths (the first group's are long, so the ranks
    need different numbers of micro-batches), with fixed advantages and behaviour logprobs."""
    g = torch.Generator().manual_seed(0)
    episodes = []
    for group, length in ((0, 40), (1, 12)):
        prompt = torch.randint(3, 200, (6,), generator=g)
        for member in range(GROUP):
            n = length + member * 3
            ids = torch.cat([prompt, torch.randint(3, 200, (n,), generator=g)])
            mask = torch.cat([torch.zeros(6), torch.ones(n)])
            old = -torch.rand(ids.numel(), generator=g) * 6 * mask
            episodes.append(UpdateRow(ids, mask, old, prompt_length=6))
    advantages = torch.tensor([1.0, -0.5, 0.25, -0.75, 0.5, -1.0, 1.5, -1.0])
    return episodes, advantages


def update(model_dir: str, ranks: Ranks) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model, _ = load_model(model_dir)
    model.requires_grad_(True)
    model = shard(model, ranks)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, betas=(0.9, 0.99))
    episodes, advantages = batch()
    mine = ranks.share(list(range(len(episodes))), GROUP)
    part = [episodes[i] for i in mine]
    weights = TokenMean().weights([e.mask for e in part], ranks.total)
    stats = policy_update(
        TrainedPolicy(model, optimizer, ranks=ranks),
        part,
        advantages[mine],
        weights,
        ClippedPolicyLoss(),
        UpdateSettings(micro_batch_tokens=64, pad_id=0, max_grad_norm=0.05),
        group_size=GROUP,
    )
    print(f"rank {ranks.rank} grad_norm {stats.grad_norm:.6f}", flush=True)
    return model, optimizer


def main(model_dir: str, out: str, fault: str = "") -> None:
    with Ranks.open() as ranks:
        model, optimizer = update(model_dir, ranks)
        weights = full_state_dict(model)
        if ranks.main:
            torch.save({k: v.detach().clone() for k, v in weights.items()}, Path(out) / "weights.pt")
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        plain, tokenizer = load_model(model_dir)
        plain.load_state_dict(weights)
        if fault == "rank0-write" and ranks.main:  # rank 0 cannot write its files (a full disk, say)

            def refuse(*args, **kwargs):
                raise OSError(28, "No space left on device")

            tokenizer.save_pretrained = refuse
        ckpt.save_checkpoint(
            Path(out) / "checkpoints",
            1,
            TrainedPolicy(model, optimizer, scheduler, ranks=ranks),
            tokenizer,
            {"epoch": 0, "index": 0},
            keep=1,
            plain=plain,
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
