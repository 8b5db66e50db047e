import math

import pytest
import torch

from trainer_node.grpo.advantages import (
    ADVANTAGES,
    AdvantageInput,
    advantage_names,
    compute_advantages,
    get_advantage,
)


def adv(name, rewards, groups):
    return compute_advantages(
        name, AdvantageInput(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups))
    ).tolist()


def test_grpo_std_normalised_with_ragged_groups():
    # group 0: [1, 0, 0, 1] mean .5, unbiased std sqrt(1/3); group 1: [1, 0, 0] mean 1/3, std sqrt(1/3)
    out = adv("grpo", [1, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1])
    s = math.sqrt(1 / 3) + 1e-6
    expected = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, (2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s]
    assert out == pytest.approx(expected, abs=1e-9)


def test_dr_grpo_is_reward_minus_group_mean():
    out = adv("dr_grpo", [1, 0, 0, 1, 0.5, 0.0, 1.0], [0, 0, 0, 0, 1, 1, 1])
    assert out == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0, -0.5, 0.5], abs=1e-12)


@pytest.mark.parametrize("name", advantage_names())
def test_zero_variance_and_singleton_groups_get_zero(name):
    out = adv(name, [1, 1, 1, 0.3, 0, 1], [0, 0, 0, 1, 2, 2])
    assert out[:4] == [0.0, 0.0, 0.0, 0.0]
    assert out[4] < 0 < out[5]


def test_interleaved_group_ids_match_contiguous():
    contiguous = adv("grpo", [1, 0, 0.2, 0.8], [0, 0, 1, 1])
    interleaved = adv("grpo", [1, 0.2, 0, 0.8], [0, 1, 0, 1])
    assert interleaved == pytest.approx([contiguous[0], contiguous[2], contiguous[1], contiguous[3]])


@pytest.mark.parametrize("name", advantage_names())
def test_every_estimator_is_centred_per_group_with_one_value_per_rollout(name):
    # The contract of an entry: (AdvantageInput) -> (N,), same dtype, each group's advantages sum to 0.
    rewards, groups = [1.0, 0.0, 0.5, 0.2, 0.9, 0.4, 0.4], [0, 0, 0, 1, 1, 2, 2]
    out = compute_advantages(name, AdvantageInput(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups)))
    assert out.shape == (7,) and out.dtype == torch.float64 and torch.isfinite(out).all()
    for group in range(3):
        assert float(out[torch.tensor(groups) == group].sum()) == pytest.approx(0.0, abs=1e-9)


def test_registry_rejects_duplicates_and_lists_names_on_miss():
    with pytest.raises(ValueError, match="advantage estimator 'grpo' is already registered"):
        ADVANTAGES.register("grpo")(lambda inputs: inputs.rewards)
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'; known: dr_grpo, grpo"):
        get_advantage("nope")
    with pytest.raises(TypeError, match="must be a function"):
        ADVANTAGES.copy().register("constant")(0.5)
    assert {"grpo", "dr_grpo"} <= set(advantage_names())
    assert ADVANTAGES.entry_point_group == "target_feedback.advantages"


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="same length"):
        AdvantageInput(torch.zeros(3), torch.zeros(2, dtype=torch.long))
