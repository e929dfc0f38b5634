"""Advantages against numbers worked out by hand."""

import pytest
import torch

from rollforge.errors import ConfigError
from rollforge.train.advantages import compute_advantages


def test_grpo_normalises_by_the_population_std():
    # group 1: rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> +1, -1, -1, +1
    # group 2: 0, 0, 0, 1 -> mean 0.25, std sqrt(0.1875) = 0.4330 -> -0.5774 x3, +1.7321
    a = compute_advantages([1, 0, 0, 1, 0, 0, 0, 1], group_size=4, estimator="grpo")
    expected = [1, -1, -1, 1, -0.57735, -0.57735, -0.57735, 1.73205]
    assert a.values.tolist() == pytest.approx(expected, abs=1e-4)
    assert (a.groups, a.zero_variance_groups) == (2, 0)


def test_dr_grpo_only_centres():
    # 3, 1 -> mean 2 -> +1, -1 ; 0.5, 0.5 -> flat -> 0, 0
    a = compute_advantages([3, 1, 0.5, 0.5], group_size=2, estimator="dr_grpo")
    assert a.values.tolist() == pytest.approx([1, -1, 0, 0])
    assert a.zero_variance_groups == 1
    assert compute_advantages([3, 1], 2, "grpo_no_std").values.tolist() == pytest.approx([1, -1])


def test_leave_one_out_baseline():
    # rewards 1, 0, 0: baselines are mean(0, 0) = 0, mean(1, 0) = 0.5, 0.5 -> 1, -0.5, -0.5
    a = compute_advantages([1, 0, 0], group_size=3, estimator="rloo")
    assert a.values.tolist() == pytest.approx([1, -0.5, -0.5])


def test_flat_groups_have_zero_advantage_and_are_counted():
    a = compute_advantages([1, 1, 0, 0, 0.3, 0.3], group_size=2, estimator="grpo")
    assert a.values.tolist() == [0, 0, 0, 0, 0, 0]
    assert a.zero_variance_groups == 3
    assert not torch.isnan(a.values).any()


def test_bad_inputs_are_named():
    with pytest.raises(ConfigError, match="groups of 4"):
        compute_advantages([1, 0, 1], 4)
    with pytest.raises(ConfigError, match="unknown advantage estimator 'ppo'"):
        compute_advantages([1, 0], 2, "ppo")
