"""Run under torchrun (or plainly, as one rank): two epochs of the ``decoupled`` loss on the fixed
batch of ``ranks_worker`` (ranks need different numbers of micro-batches, so one runs empty passes),
one ``Proximal`` per rank. Used by test_off_policy_loss.py.

    python -m torch.distributed.run --standalone --nproc-per-node 2 off_policy_ranks_worker.py MODEL_DIR OUT_DIR
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from ranks_worker import GROUP, batch
from rollforge.models import load_model
from rollforge.train.corrections import DecoupledPolicyLoss, Proximal
from rollforge.train.distributed import Ranks, full_state_dict, shard
from rollforge.train.losses import TokenMean
from rollforge.train.step_metrics import merge_update_stats
from rollforge.train.update import TrainedPolicy, UpdateSettings, policy_update


def update(model_dir: str, ranks: Ranks):
    """(model, merged UpdateStats of each epoch (rank 0; None elsewhere), this rank's Proximal)."""
    torch.manual_seed(0)
    model, _ = load_model(model_dir)
    model.requires_grad_(True)
    model = shard(model, ranks)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    episodes, advantages = batch()
    mine = ranks.share(list(range(len(episodes))), GROUP)
    part = [episodes[i] for i in mine]
    weights = TokenMean().weights([e.mask for e in part], ranks.total)
    proximal = Proximal(len(part))
    epochs = []
    for _ in range(2):
        stats = policy_update(
            TrainedPolicy(model, optimizer, ranks=ranks),
            part,
            advantages[mine],
            weights,
            DecoupledPolicyLoss(cap=2.0),
            UpdateSettings(micro_batch_tokens=64, pad_id=0),
            group_size=GROUP,
            proximal=proximal,
        )
        gathered = ranks.gather(stats)
        epochs.append(merge_update_stats(gathered) if gathered is not None else None)
    return model, epochs, proximal


def main(model_dir: str, out: str) -> None:
    with Ranks.open() as ranks:
        model, epochs, _ = update(model_dir, ranks)
        weights = full_state_dict(model)
        if ranks.main:
            torch.save({k: v.detach().clone() for k, v in weights.items()}, Path(out) / "weights.pt")
            (Path(out) / "stats.json").write_text(json.dumps([asdict(s) for s in epochs]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
