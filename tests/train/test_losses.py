"""The clipped policy loss and its aggregations against numbers worked out by hand."""

import math

import pytest
import torch

from rollforge.errors import ConfigError
from rollforge.train.losses import ClippedPolicyLoss, FixedNormalizer, SequenceMean, TokenMean, get_aggregation

MASKS = [torch.tensor([0.0, 1, 1, 1]), torch.tensor([0.0, 0, 1, 0])]  # 3 policy tokens, then 1


def test_token_mean_weights_every_policy_token_equally():
    w = TokenMean().weights(MASKS)  # 4 policy tokens in the batch -> 1/4 each
    assert w[0].tolist() == [0, 0.25, 0.25, 0.25] and w[1].tolist() == [0, 0, 0.25, 0]


def test_sequence_mean_weights_every_episode_equally():
    w = SequenceMean().weights(MASKS)  # 2 episodes: 1/(2*3) per token of the first, 1/(2*1) of the second
    assert w[0].tolist() == pytest.approx([0, 1 / 6, 1 / 6, 1 / 6]) and w[1].tolist() == [0, 0, 0.5, 0]


def test_fixed_normaliser_ignores_lengths():
    w = FixedNormalizer(10).weights(MASKS)  # 1 / (2 episodes x 10 tokens) = 0.05
    assert w[0].tolist() == pytest.approx([0, 0.05, 0.05, 0.05]) and w[1].tolist() == pytest.approx([0, 0, 0.05, 0])


def test_aggregations_by_name():
    assert isinstance(get_aggregation("token"), TokenMean)
    with pytest.raises(ConfigError, match="unknown loss aggregation 'mean'"):
        get_aggregation("mean")


def test_on_policy_loss_is_minus_the_weighted_advantage():
    # ratio 1 everywhere: pg_t = -A; token weights 1/4 -> loss = -(3 * 2 + 1 * -1) / 4 = -1.25
    logp = torch.tensor([[0.0, -1, -2, -3], [0, 0, -0.5, 0]], requires_grad=True)
    parts = ClippedPolicyLoss()(logp, logp.detach(), torch.tensor([2.0, -1.0]), torch.stack(TokenMean().weights(MASKS)))
    assert parts.loss.item() == pytest.approx(-1.25)
    assert (parts.tokens, parts.clipped_tokens) == (4, 0)
    parts.loss.backward()  # d loss / d logp_t = -A * w_t (ratio 1)
    assert logp.grad.flatten().tolist() == pytest.approx([0, -0.5, -0.5, -0.5, 0, 0, 0.25, 0])


def test_clipping_takes_the_pessimistic_branch():
    # One token, weight 1. log-ratio ln(1.5): ratio 1.5.
    #   A = +1: min(1.5, clip(1.5)=1.2) = 1.2 -> loss -1.2, clipped, and no gradient.
    #   A = -1: min(-1.5, -1.2) = -1.5 -> loss 1.5, not clipped.
    old = torch.tensor([[0.0, 0.0]])
    weights = torch.tensor([[0.0, 1.0]])
    logp = torch.tensor([[0.0, math.log(1.5)]], requires_grad=True)
    loss = ClippedPolicyLoss(0.2, 0.2)
    up = loss(logp, old, torch.tensor([1.0]), weights)
    assert up.loss.item() == pytest.approx(-1.2) and up.clipped_tokens == 1
    up.loss.backward()
    assert logp.grad.abs().sum().item() == 0
    down = loss(logp, old, torch.tensor([-1.0]), weights)
    assert down.loss.item() == pytest.approx(1.5) and down.clipped_tokens == 0
    # clip-higher: with clip_high 0.6 the ratio 1.5 is inside the band -> -1.5
    assert ClippedPolicyLoss(0.2, 0.6)(logp, old, torch.tensor([1.0]), weights).loss.item() == pytest.approx(-1.5)
    # ratio 0.5 with A = -1: clip(0.5) = 0.8 -> min(-0.5, -0.8) = -0.8 -> loss 0.8, clipped
    low = torch.tensor([[0.0, math.log(0.5)]])
    parts = loss(low, old, torch.tensor([-1.0]), weights)
    assert parts.loss.item() == pytest.approx(0.8) and parts.clipped_tokens == 1


def test_k3_kl_to_the_reference():
    # delta = ref - logp = ln 2: kl = e^delta - delta - 1 = 2 - ln 2 - 1 = 0.30685; beta 0.1, A = 0,
    # weight 1 -> loss = 0.030685.
    logp = torch.tensor([[0.0, 0.0]])
    ref = torch.tensor([[5.0, math.log(2)]])  # position 0 is off the mask and must not count
    parts = ClippedPolicyLoss(kl_beta=0.1)(logp, logp, torch.tensor([0.0]), torch.tensor([[0.0, 1.0]]), ref)
    assert parts.kl == pytest.approx(1 - math.log(2))
    assert parts.loss.item() == pytest.approx(0.1 * (1 - math.log(2)))
    with pytest.raises(ConfigError, match="reference"):
        ClippedPolicyLoss(kl_beta=0.1)(logp, logp, torch.tensor([0.0]), torch.tensor([[0.0, 1.0]]))


def test_masked_tokens_never_contribute_even_with_huge_ratios():
    logp = torch.tensor([[50.0, 0.0]], requires_grad=True)  # position 0 has ratio e^50 but mask 0
    parts = ClippedPolicyLoss()(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.tensor([[0.0, 1.0]]))
    assert parts.loss.item() == pytest.approx(-1.0)
    parts.loss.backward()
    assert logp.grad[0, 0].item() == 0
