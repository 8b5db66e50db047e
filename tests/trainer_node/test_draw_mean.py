"""draw_mean (issue 19): GRPO on the mean of several grader draws' coefficients, the baseline that
tells SetGRPO's set, recovery and gate apart from the second grader draw they read."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from tests.trainer_node.setgrpo_groups import make_input, noisy_groups
from trainer_node.grpo import setgrpo as sg
from trainer_node.grpo.settings import GRPOSettings
from trainer_node.grpo.update_seam import UpdateSeams, build_rule


def test_it_trains_every_group_on_the_mean_of_its_draws_coefficients():
    inputs = make_input([[[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]], [[1.0, 1.0]] * 4])
    out = build_rule("coefficients", {"name": "draw_mean"}).coefficients(inputs)
    first = torch.arange(4)
    expected = 0.5 * (sg.standardise(torch.tensor([1.0, 0.0, 1.0, 0.0]))
                      + sg.standardise(torch.tensor([0.0, 0.0, 1.0, 1.0])))
    assert torch.allclose(out.advantages[first].to(torch.float64), expected)
    assert bool(out.keep[first].all()) and not bool(out.keep[4:].any())  # the second group has no spread


def test_two_draws_are_setgrpo_point_coefficients_and_one_draw_is_grpo():
    inputs = make_input(noisy_groups(np.random.default_rng(3), 6))
    mean = build_rule("coefficients", {"name": "draw_mean"}).coefficients(inputs)
    setgrpo = build_rule("coefficients", {"name": "setgrpo"})
    for rows in inputs.groups():
        centre, _ = setgrpo.group_set(inputs.grader_scores, rows)
        assert torch.allclose(mean.advantages[rows].to(torch.float64), centre)
    one = build_rule("coefficients", {"name": "draw_mean", "draws": 1}).coefficients(inputs)
    for rows in inputs.groups():
        assert torch.allclose(one.advantages[rows].to(torch.float64), sg.standardise(inputs.grader_scores[rows, 0]))


@pytest.mark.parametrize("a,b", [(2.0, 1.0), (0.5, -3.0)])
def test_positive_affine_rewards_leave_it_unchanged(a, b):
    groups = noisy_groups(np.random.default_rng(4), 6)
    rule = build_rule("coefficients", {"name": "draw_mean"})
    base = rule.coefficients(make_input(groups))
    moved = rule.coefficients(make_input([[[a * x + b for x in row] for row in g] for g in groups]))
    assert torch.equal(base.keep, moved.keep)
    assert torch.allclose(base.advantages, moved.advantages, atol=1e-4)


def test_the_seam_asks_the_grader_for_its_draws_and_bad_options_name_the_field():
    seams = UpdateSeams.from_settings(GRPOSettings(coefficients={"name": "draw_mean", "draws": 3}))
    assert seams.grader_draws == 3 and "grader_scores" in seams.requires
    with pytest.raises(ValidationError, match=r"coefficients\.draws"):
        GRPOSettings(coefficients={"name": "draw_mean", "draws": 0})
    with pytest.raises(ValueError, match="4 grader draws"):  # the groups hold 3 draws per rollout
        build_rule("coefficients", {"name": "draw_mean", "draws": 4}).coefficients(
            make_input(noisy_groups(np.random.default_rng(0), 2)))
