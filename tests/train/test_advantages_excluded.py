"""Advantages with infrastructure failures left out of their group, against numbers worked out by hand."""

import math

import pytest
import torch

from rollforge.errors import ConfigError
from rollforge.train.advantages import compute_advantages

KEEP_ALL_BUT_THIRD = [True, True, False, True]


def test_grpo_takes_mean_and_population_std_over_the_kept_members():
    # group [1, 0, X, 1]: kept 1, 0, 1 -> mean 2/3; deviations +1/3, -2/3, +1/3;
    # population variance (1/9 + 4/9 + 1/9) / 3 = 2/9, std sqrt(2/9) = 0.471405
    # -> (1/3) / 0.471405 = +0.707107 (= 1/sqrt 2), (-2/3) / 0.471405 = -1.414214 (= -sqrt 2), X -> exactly 0.
    # The excluded reward (here 5: whatever it is, it must not matter) is never read.
    a = compute_advantages([1, 0, 5, 1], group_size=4, estimator="grpo", keep=KEEP_ALL_BUT_THIRD)
    std = math.sqrt(2 / 9) + 1e-6
    assert a.values.tolist() == pytest.approx([(1 / 3) / std, (-2 / 3) / std, 0.0, (1 / 3) / std], abs=1e-6)
    assert a.values.tolist() == pytest.approx([0.707107, -1.414213, 0.0, 0.707107], abs=1e-5)
    assert a.values[2].item() == 0.0
    assert (a.excluded, a.shrunk_groups, a.lost_groups, a.zero_variance_groups, a.groups) == (1, 1, 0, 0, 1)


def test_rloo_leaves_one_out_of_the_kept_members():
    # kept 1, 0, 1 (K = 3): baselines mean(0, 1) = 0.5, mean(1, 1) = 1, mean(1, 0) = 0.5
    # -> 1 - 0.5 = +0.5, 0 - 1 = -1, X -> 0, 1 - 0.5 = +0.5
    a = compute_advantages([1, 0, float("nan"), 1], group_size=4, estimator="rloo", keep=KEEP_ALL_BUT_THIRD)
    assert a.values.tolist() == [0.5, -1.0, 0.0, 0.5]


def test_dr_grpo_only_centres_over_the_kept():
    # kept 3, 1 (X = 100 dropped) -> mean 2 -> +1, -1
    a = compute_advantages(
        [3, 100, 1, 0.5, 0.5, 0.5], group_size=3, estimator="dr_grpo", keep=[True, False, True, True, True, True]
    )
    assert a.values.tolist() == [1.0, 0.0, -1.0, 0.0, 0.0, 0.0]
    assert (a.zero_variance_groups, a.shrunk_groups) == (1, 1)


def test_a_group_left_with_one_member_contributes_nothing_and_is_counted():
    # group 1: 3 of 4 excluded -> no baseline -> all zero, lost; group 2 untouched:
    # 0, 0, 0, 1 -> mean 0.25, std sqrt(0.1875) = 0.4330 -> -0.57735 x3, +1.73205
    a = compute_advantages(
        [1, 0, 0, 0, 0, 0, 0, 1],
        group_size=4,
        estimator="grpo",
        keep=[True, False, False, False, True, True, True, True],
    )
    assert a.values[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert a.values[4:].tolist() == pytest.approx([-0.57735, -0.57735, -0.57735, 1.73205], abs=1e-4)
    assert (a.excluded, a.shrunk_groups, a.lost_groups, a.zero_variance_groups) == (3, 0, 1, 0)
    nobody = compute_advantages([1, 0], group_size=2, estimator="rloo", keep=[False, False])
    assert nobody.values.tolist() == [0.0, 0.0] and (nobody.lost_groups, nobody.excluded) == (1, 2)
    assert not torch.isnan(nobody.values).any()


def test_flat_kept_members_are_a_zero_variance_group():
    # kept 1, 1 (the 0 is excluded): no signal left
    a = compute_advantages([1, 0, 1], group_size=3, estimator="grpo", keep=[True, False, True])
    assert a.values.tolist() == [0.0, 0.0, 0.0]
    assert (a.zero_variance_groups, a.shrunk_groups, a.lost_groups) == (1, 1, 0)


@pytest.mark.parametrize("estimator", ["grpo", "grpo_no_std", "dr_grpo", "rloo"])
def test_keeping_everyone_is_bit_identical_to_no_keep(estimator):
    rewards = [0.3, 1.0, 0.0, 0.7, 0.1, 0.1, 0.9, 0.25, 1, 1, 1, 1]
    plain = compute_advantages(rewards, 4, estimator)
    kept = compute_advantages(rewards, 4, estimator, keep=[True] * 12)
    assert torch.equal(plain.values, kept.values)

    def counts(a):
        return a.zero_variance_groups, a.groups, a.excluded, a.shrunk_groups, a.lost_groups

    assert counts(plain) == counts(kept) == (1, 3, 0, 0, 0)


def test_groups_without_exclusions_match_the_plain_computation():
    rewards = [0.3, 1.0, 0.0, 0.7, 1, 0, 5, 1]
    mixed = compute_advantages(rewards, 4, "grpo", keep=[True] * 4 + KEEP_ALL_BUT_THIRD)
    assert mixed.values[:4].tolist() == pytest.approx(
        compute_advantages(rewards[:4], 4, "grpo").values.tolist(), abs=1e-6
    )


def test_a_keep_of_the_wrong_length_is_named():
    with pytest.raises(ConfigError, match="keep has 3 entries for 4 rewards"):
        compute_advantages([1, 0, 1, 0], 2, keep=[True, True, False])
