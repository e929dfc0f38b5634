"""The trained model and what surrounds it: device and precision, the optional LoRA adapter, the
optimizer, the learning-rate schedule and the frozen reference for the KL term.

Precision (``model.dtype``) is a *compute* precision. Weights the optimizer updates are stored in
float32 whatever it is: AdamW on bfloat16 weights rounds away updates smaller than 2^-8 of a
weight (a 1e-5 learning rate does nothing to most of them), so the float32 weights are the master
copy and, with bfloat16, ``policy_update`` runs its forward passes under ``torch.autocast``
(``compute_dtype``). AdamW's moments follow their parameters, so they are float32 too. Weights
nobody updates (the KL reference, the base model under a LoRA adapter, whose adapter peft keeps in
float32) are stored in the compute precision, which halves their memory.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import require
from ..models import load_model, resolve_device, resolve_dtype
from .config import LoraConfig, ModelConfig, OptimConfig
from .update import Reference


def compute_dtype(model: ModelConfig) -> torch.dtype:
    """The precision of the update's forward passes (``model.dtype`` resolved on ``model.device``)."""
    return resolve_dtype(model.dtype, resolve_device(model.device))


def generation_dtype(model: ModelConfig) -> torch.dtype:
    """The precision the generation backend computes in (``model.generation_dtype``; auto: ``compute_dtype``)."""
    if model.generation_dtype == "auto":
        return compute_dtype(model)
    return resolve_dtype(model.generation_dtype, resolve_device(model.device))


def load_policy(spec: ModelConfig, lora: LoraConfig, tokenizer: Any = None) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the model on ``spec.device`` in eval mode (the update switches
    modes), trainable parameters float32 and requiring grad, wrapped with a LoRA adapter when
    configured (its frozen base in the compute precision). ``tokenizer``: the run's, already loaded."""
    device = resolve_device(spec.device)
    frozen_dtype = resolve_dtype(spec.dtype, device)
    dtype = frozen_dtype if lora.enabled else torch.float32
    model, tokenizer = load_model(spec.name, dtype=dtype, device=device, tokenizer=tokenizer)
    if lora.enabled:
        peft = require("peft", extra="train", feature="LoRA training")
        adapter = peft.LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
            task_type="CAUSAL_LM",
        )
        model = peft.get_peft_model(model, adapter, autocast_adapter_dtype=True)  # adapter weights float32
    else:
        model.requires_grad_(True)
    return model.eval(), tokenizer


def make_optimizer(model: Any, optim: OptimConfig, optimizer_steps: int) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable parameters and its schedule over ``optimizer_steps`` steps."""
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    # The fused kernel (one pass over each tensor instead of a dozen) is the same AdamW; it is also
    # what transformers' Trainer uses by default ("adamw_torch_fused").
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    optimizer = torch.optim.AdamW(
        params,
        lr=optim.lr,
        betas=optim.betas,
        weight_decay=optim.weight_decay,
        fused=fused or None,
    )
    scheduler = get_scheduler(
        "constant_with_warmup" if optim.schedule == "constant" else optim.schedule,
        optimizer,
        num_warmup_steps=optim.warmup_steps,
        num_training_steps=optimizer_steps,
    )
    return optimizer, scheduler


def make_reference(model: Any, spec: ModelConfig, kl_beta: float, lora: bool) -> Reference | None:
    """None without a KL term (``kl_beta`` 0); the adapter-less model under LoRA; else a frozen
    copy of the initial weights on the policy's device, stored in the compute precision."""
    if kl_beta == 0:
        return None
    if lora:
        return Reference(model, disable_adapter=True)
    device = next(model.parameters()).device
    reference, _ = load_model(spec.name, dtype=resolve_dtype(spec.dtype, device), device=device)
    reference.requires_grad_(False)
    return Reference(reference)
