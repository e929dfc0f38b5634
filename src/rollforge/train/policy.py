"""The trained model and what surrounds it: precision, the optional LoRA adapter, the optimizer,
the learning-rate schedule and the frozen reference for the KL term."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import require
from ..models import load_model
from .config import TrainConfig
from .update import Reference


def load_policy(config: TrainConfig) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the model in eval mode (the update switches modes), trainable
    parameters requiring grad, wrapped with a LoRA adapter when configured."""
    dtype = torch.bfloat16 if config.model.dtype == "bfloat16" else torch.float32
    model, tokenizer = load_model(config.model.name, dtype=dtype)
    if config.lora.enabled:
        peft = require("peft", extra="train", feature="LoRA training")
        lora = peft.LoraConfig(
            r=config.lora.r,
            lora_alpha=config.lora.alpha,
            lora_dropout=config.lora.dropout,
            target_modules=config.lora.target_modules,
            task_type="CAUSAL_LM",
        )
        model = peft.get_peft_model(model, lora)
    else:
        model.requires_grad_(True)
    return model.eval(), tokenizer


def make_optimizer(model: Any, config: TrainConfig) -> tuple[torch.optim.Optimizer, Any]:
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    # The fused kernel (one pass over each tensor instead of a dozen) is the same AdamW; it is also
    # what transformers' Trainer uses by default ("adamw_torch_fused").
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    optimizer = torch.optim.AdamW(
        params, lr=config.optim.lr, betas=config.optim.betas, weight_decay=config.optim.weight_decay,
        fused=fused or None,
    )
    scheduler = get_scheduler(
        "constant_with_warmup" if config.optim.schedule == "constant" else config.optim.schedule,
        optimizer,
        num_warmup_steps=config.optim.warmup_steps,
        num_training_steps=config.steps * config.algorithm.epochs_per_batch,
    )
    return optimizer, scheduler


def make_reference(model: Any, config: TrainConfig) -> Reference | None:
    """None without a KL term; the adapter-less model under LoRA; else a frozen copy of the
    initial weights."""
    if config.algorithm.kl_beta == 0:
        return None
    if config.lora.enabled:
        return Reference(model, disable_adapter=True)
    dtype = torch.bfloat16 if config.model.dtype == "bfloat16" else torch.float32
    reference, _ = load_model(config.model.name, dtype=dtype)
    reference.requires_grad_(False)
    return Reference(reference)
