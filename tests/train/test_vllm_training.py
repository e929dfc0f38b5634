"""Training with the in-process vLLM backend: after a GRPO step the engine serves the trainer's
updated weights (its logprobs for a fixed sequence match the trainer's model)."""

import pytest
import torch

from rollforge.backends.base import SamplingParams
from rollforge.models import load_model
from rollforge.recipes.launch import train
from rollforge.train.config import load_config
from rollforge.inputs.rewards import RewardFunction
from rollforge.train.logprobs import sequence_logprobs

pytest.importorskip("vllm")


def reply_length(prompts, completions, **_):
    """A dense reward, so that every group has variance and the step moves the weights."""
    return [len(c[0]["content"]) / 10 if c else 0.0 for c in completions]


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [0, 1])
def test_engine_serves_the_updated_policy_after_each_step(smollm2_dir, tmp_path, staleness):
    """With max_staleness 1 the weights reach the engine between requests while the next step's
    episodes are being generated (the versioned backend), after each of two steps."""
    config = load_config(
        overrides=[
            f"model.name={smollm2_dir}",
            "model.backend=vllm",
            f"out={tmp_path}",
            f"steps={1 + staleness}",
            "checkpoint_every=0",
            f"algorithm.max_staleness={staleness}",
            "environments=[{name: arithmetic}]",
            "algorithm.batch_size=2",
            "algorithm.group_size=4",
            "algorithm.advantage=rloo",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=1",
            "optim.lr=1e-4",
            "optim.max_grad_norm=null",
        ]
    )
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198, 1, 4093, 198]  # a fixed chat prefix
    seen = {}

    async def compare(step, metrics, model, backend):
        completion = await backend.generate(prompt, SamplingParams(max_new_tokens=6, temperature=0))
        ids = torch.tensor([[*prompt, *completion.token_ids]])
        targets = torch.zeros_like(ids, dtype=torch.bool)
        targets[0, len(prompt) :] = True
        with torch.no_grad():
            trainer = sequence_logprobs(model, ids, torch.ones_like(ids), targets)[0, len(prompt) :]
            before = sequence_logprobs(initial, ids, torch.ones_like(ids), targets)[0, len(prompt) :]
        seen["gap"] = max(seen.get("gap", 0.0), (trainer - torch.tensor(completion.logprobs)).abs().max().item())
        seen["version"] = completion.version
        seen["moved"] = (trainer - before).abs().max().item()
        seen["grad_norm"] = metrics["grad_norm"]

    initial, _ = load_model(smollm2_dir)
    train(config, console=False, on_step=compare, reward_functions=[RewardFunction("length", reply_length)])
    assert seen["grad_norm"] > 0 and seen["moved"] > 1e-2, seen  # the step changed the policy visibly
    assert seen["gap"] < 1e-3, seen  # and the engine serves exactly the new one
    assert seen["version"] == (None if staleness == 0 else 2)  # async: stamped with the last update's version
