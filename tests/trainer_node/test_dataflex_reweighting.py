"""Calibration smoke tests of DataFlex-RL's four reweighting rules (seed 001, Table 1): each
rule's signal and its weights w_gkl, on hand-made groups, after the seam's rescaling to mean 1
(as DataFlex-RL's reweighters normalise). The reweighting objective is the seed's Eq. 2:

    L_rew = 1/(GK) sum_g sum_k 1/L_gk sum_l w_gkl loss_gkl,   w_gkl >= 0
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.trainer_node.dataflex_groups import make_input, row_weights
from trainer_node.grpo.update_seam import UpdateSeams, build_rule


def weights_of(rule: str | dict, inputs) -> torch.Tensor:
    return UpdateSeams(reweighting=build_rule("reweighting", rule)).token_factor(inputs)


def test_ar_weighs_each_token_by_half_its_probability_plus_a_half():
    """w_il proportional to 0.5 * pi_il + 0.5, pi the token's probability (Table 1), mean 1 over tokens."""
    probabilities = [[1.0, 0.5, 0.2], [1.0, 0.1, 0.9]]  # column 0 is the prompt's last token
    logprobs = [[math.log(p) for p in row] for row in probabilities]
    inputs = make_input([[1.0, 0.0]], lengths=[[2, 2]], token_logprobs=logprobs)
    raw = np.array([0.5 * 0.5 + 0.5, 0.5 * 0.2 + 0.5, 0.5 * 0.1 + 0.5, 0.5 * 0.9 + 0.5])  # .75 .6 .55 .95
    expected = raw / raw.mean()
    factor = weights_of("ar", inputs)
    assert factor[:, 1:].flatten().tolist() == pytest.approx(expected.tolist(), rel=1e-5)
    assert factor[:, 0].tolist() == [0.0, 0.0]  # no weight off the completion tokens


def test_ar_requires_the_token_logprobs_and_says_so():
    rule = build_rule("reweighting", "ar")
    assert rule.requires == {"token_logprobs"}
    with pytest.raises(ValueError, match="token_logprobs"):
        UpdateSeams(reweighting=rule).token_factor(make_input([[1.0, 0.0]]))


def test_per_weighs_responses_by_the_square_root_of_their_mean_absolute_advantage():
    """w_i proportional to (a_i + eps)^0.5 (Table 1), rescaled to mean 1 over responses."""
    advantages = [1.0, -0.25, 0.0, 2.25]
    inputs = make_input([[1.0, 0.0, 0.5, 1.0]], advantages=advantages)
    raw = np.sqrt(np.abs(advantages) + 1e-8)
    assert row_weights(weights_of("per", inputs), inputs) == pytest.approx((raw / raw.mean()).tolist(), rel=1e-5)


def test_softmax_weighs_responses_by_exp_of_their_mean_absolute_advantage():
    """w_i proportional to exp(a_i / T), T = 1 (Table 1), rescaled to mean 1."""
    advantages = [1.0, -1.0, 0.0, 2.0, 0.5, -0.5]
    inputs = make_input([[1.0, 0.0, 0.5], [1.0, 0.0, 0.5]], advantages=advantages)
    raw = np.exp(np.abs(advantages))
    assert row_weights(weights_of("softmax", inputs), inputs) == pytest.approx((raw / raw.mean()).tolist(), rel=1e-5)
    hot = weights_of({"name": "softmax", "temperature": 2.0}, inputs)
    raw2 = np.exp(np.abs(advantages) / 2.0)
    assert row_weights(hot, inputs) == pytest.approx((raw2 / raw2.mean()).tolist(), rel=1e-5)


def test_diffband_doubles_the_weight_between_the_reward_quartiles():
    """2x weight for r_i between the 25% and 75% quantiles of the batch's rewards (Table 1)."""
    inputs = make_input([[0.0, 0.25, 0.5, 0.75, 1.0]])  # quartiles 0.25 and 0.75, band closed
    raw = np.array([1.0, 2.0, 2.0, 2.0, 1.0])
    assert row_weights(weights_of("diffband", inputs), inputs) == pytest.approx((raw / raw.mean()).tolist())


def test_diffband_with_binary_rewards_weighs_the_majority_or_nothing():
    """DataFlex-RL's quantile band on 0/1 rewards: with a mixed batch where either value holds
    over a quarter of the responses the band is everything (the identity); with a 1-in-5 minority
    only the majority value is in the band."""
    balanced = make_input([[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0]])
    assert row_weights(weights_of("diffband", balanced), balanced) == pytest.approx([1.0] * 8)
    skewed = make_input([[1.0, 0.0, 0.0, 0.0, 0.0]])
    raw = np.array([1.0, 2.0, 2.0, 2.0, 2.0])
    assert row_weights(weights_of("diffband", skewed), skewed) == pytest.approx((raw / raw.mean()).tolist())


def test_response_weights_are_constant_over_a_response_and_mean_one_over_responses():
    """Per-response weights: mean 1 over responses (not token-weighted), as DataFlex-RL."""
    inputs = make_input([[1.0, 0.0, 0.0, 0.0]], lengths=[[1, 2, 3, 4]], advantages=[1.0, 2.0, 3.0, 4.0])
    factor = weights_of("softmax", inputs)
    mask = inputs.completion_mask.bool()
    for row in range(4):
        values = factor[row][mask[row]]
        assert torch.allclose(values, values[0].expand_as(values))
    assert np.mean(row_weights(factor, inputs)) == pytest.approx(1.0)
