"""The update step on the tiny model: logprobs agree with generation, micro-batching does not
change the gradient, and only policy tokens move the loss."""

import pytest
import torch

from rollforge import ChatRenderer, HFBackend, RolloutConfig, rollout
from rollforge.envs.library import get_env_spec
from rollforge.models import load_model
from rollforge.train.losses import ClippedPolicyLoss, TokenMean
from rollforge.train.update import Episode, pack_micro_batches, policy_update, sequence_logprobs


@pytest.fixture(scope="module")
def rolled(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    spec = get_env_spec("guess_number")
    backend = HFBackend(model, tokenizer)
    try:
        result = rollout(spec.samples(6, 0), {"guess_number": spec.build()}, backend, ChatRenderer(tokenizer),
                         RolloutConfig(max_turns=3, max_new_tokens=6, seed=1))
    finally:
        import asyncio

        asyncio.run(backend.close())
    return model, tokenizer, result.trajectories


def test_trainer_logprobs_match_the_generation_logprobs(rolled):
    model, tokenizer, trajectories = rolled
    assert any(t.turns > 1 for t in trajectories)  # multi-turn: env tokens sit between policy tokens
    for t in trajectories:
        e = Episode.from_trajectory(t)
        with torch.no_grad():
            lp = sequence_logprobs(model, e.ids[None], torch.ones_like(e.ids)[None], e.mask[None] > 0)[0]
        assert torch.allclose(lp[e.mask > 0], e.old_logprobs[e.mask > 0], atol=1e-4)
        assert lp[e.mask == 0].abs().sum() == 0


def test_packing_respects_the_token_budget():
    batches = pack_micro_batches([10, 50, 20, 30, 5], micro_batch_tokens=60)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    lengths = [10, 50, 20, 30, 5]
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 60 or len(b) == 1
    assert pack_micro_batches([100], 10) == [[0]]  # an over-long episode still trains, alone


def test_micro_batching_gives_the_full_batch_gradient(rolled):
    model, tokenizer, trajectories = rolled
    episodes = [Episode.from_trajectory(t) for t in trajectories]
    weights = TokenMean().weights([e.mask for e in episodes])
    advantages = torch.linspace(-1, 1, len(episodes))
    grads, losses = [], []
    for budget in (100_000, 1):  # one micro-batch vs one episode per micro-batch
        captured = []

        class Capture(torch.optim.SGD):
            def step(self, closure=None):
                captured.extend(p.grad.clone() for p in model.parameters() if p.grad is not None)

        stats = policy_update(model, Capture(model.parameters(), lr=0.0), episodes, advantages, weights,
                              ClippedPolicyLoss(), micro_batch_tokens=budget, pad_id=tokenizer.pad_token_id)
        grads.append(captured)
        losses.append(stats.loss)
        assert stats.micro_batches == (1 if budget > 1 else len(episodes))
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)
    assert stats.mean_ratio == pytest.approx(1.0, abs=1e-4)  # on-policy: ratio 1
    assert stats.policy_tokens == sum(int(e.mask.sum()) for e in episodes)
