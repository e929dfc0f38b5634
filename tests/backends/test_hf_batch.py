"""The HF backend's running batch (rollforge.backends.hf_batch) on the model's device: every
tensor it hands the model is created on the device of the model's parameters."""

from __future__ import annotations

import random

import torch

from rollforge.backends.base import SamplingParams, StopStrings
from rollforge.backends.hf_batch import Request, Row, RunningBatch
from rollforge.backends.sampling import sample
from rollforge.models import load_model


def test_prefill_decode_join_and_select_stay_on_the_models_device(tiny_model_dir):
    # No GPU here: with "meta" as the default device and the model on the CPU, a tensor created
    # without naming the model's device lands on "meta" and fails the hook or the computation.
    model, tokenizer = load_model(tiny_model_dir)
    device = next(model.parameters()).device
    seen = []

    def check(module, args, kwargs):
        tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        seen.append({t.device for t in tensors})

    model.register_forward_pre_hook(check, with_kwargs=True)

    def row(prompt, seed):
        request = Request(tuple(prompt), SamplingParams(max_new_tokens=4, seed=seed), None, None)
        return Row(request, 4, frozenset(), StopStrings(tokenizer.decode, ()))

    with torch.device("meta"), torch.inference_mode():
        batch, logits = RunningBatch.prefill(model, [row([5, 6, 7], 1), row([8, 9], 2)], 0, random.Random(0), device)
        tokens, _ = sample(logits, batch.uniforms[:, 0], batch.sampling)
        batch.last = tokens
        batch.decode(model)
        joining, _ = RunningBatch.prefill(model, [row([3, 4, 5, 6, 7], 3)], 0, random.Random(0), device)
        batch.extend(joining)
        batch.select([0, 2])
        logits = batch.decode(model)
    assert logits.device == device and logits.shape == (2, model.config.vocab_size)
    assert seen == [{device}] * 4  # two prefills, two decode steps
    for tensor in (batch.mask, batch.positions, batch.last, batch.steps, batch.uniforms):
        assert tensor.device == device
