"""Calibration smoke tests of DataFlex-RL's four selection rules (seed 001, Table 1): each rule's
signal and its mask m_gk, on hand-made groups of K = 5 responses, as DataFlex-RL checks them
before its runs. The selection objective is the seed's Eq. 1:

    L_sel = 1/(GK) sum_g sum_k m_gk / L_gk sum_l loss_gkl,   m_gk in {0, 1}
"""

from __future__ import annotations

import pytest
import torch

from tests.trainer_node.dataflex_groups import kept, make_input
from trainer_node.grpo.update_rules.maxvar import max_variance_subset
from trainer_node.grpo.update_seam import build_rule
from trainer_node.grpo.update_signals import efficiency, group_solve_rate, mean_abs_advantage


def test_difffilter_keeps_a_group_iff_its_solve_rate_is_strictly_between_0_2_and_0_8():
    """q_g = (1/K) sum_k 1[r_gk > 0.5]; retain group iff 0.2 < q_g < 0.8 (Table 1)."""
    groups = [[1.0] * c + [0.0] * (5 - c) for c in range(6)]  # 0..5 correct of 5
    inputs = make_input(groups)
    q = group_solve_rate(inputs)
    assert q.view(6, 5)[:, 0].tolist() == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    mask = build_rule("selection", "difffilter").keep(inputs)
    assert kept(mask) == list(range(10, 20))  # only the groups with 2 and 3 correct (q = 0.4, 0.6)


def test_difffilter_counts_a_response_as_solved_only_above_the_threshold():
    inputs = make_input([[0.5, 0.5, 0.6, 0.6, 0.0]])  # 0.5 is not > 0.5: q = 0.4
    assert group_solve_rate(inputs)[0] == pytest.approx(0.4)
    assert kept(build_rule("selection", "difffilter").keep(inputs)) == [0, 1, 2, 3, 4]
    wide = build_rule("selection", {"name": "difffilter", "low": 0.5, "high": 0.9})
    assert kept(wide.keep(inputs)) == []


def test_maxvar_keeps_the_two_of_five_responses_with_the_largest_reward_variance():
    """Retain the subset maximising reward variance; n = round(0.5 * 5) = 2 (Python rounds half
    to even, as DataFlex-RL's MaxVarianceSelector): the lowest and the highest reward."""
    inputs = make_input([[0.1, 0.5, 0.9, 0.3, 0.7], [0.0, 0.0, 1.0, 1.0, 1.0], [1.0] * 5])
    mask = build_rule("selection", "maxvar").keep(inputs)
    assert kept(mask) == [0, 2, 5, 9, 13, 14]
    # group 2 (binary): the first lowest 0 and the last highest 1 (rewards sorted stably);
    # group 3 (all equal): every subset has variance 0, so the first a of the scan wins: a = 0,
    # the n highest of the stable ascending order, i.e. the last two responses.


def test_maxvar_subset_is_the_exhaustive_optimum():
    import itertools

    rewards = [0.3, 0.9, 0.1, 0.8, 0.25, 0.6, 0.05]
    for keep in range(1, len(rewards) + 1):
        chosen = max_variance_subset(rewards, keep)
        variance = torch.tensor([rewards[i] for i in chosen], dtype=torch.float64).var(unbiased=False)
        best = max(torch.tensor([rewards[i] for i in c], dtype=torch.float64).var(unbiased=False)
                   for c in itertools.combinations(range(len(rewards)), keep))
        assert len(chosen) == keep and float(variance) == pytest.approx(float(best))


def test_gfpo_keeps_the_top_three_of_five_by_reward_per_token():
    """Signal r_i / L_i; retain the top 3 of 5 responses of each group (Table 1)."""
    inputs = make_input([[1.0, 1.0, 1.0, 0.0, 1.0]], lengths=[[2, 4, 1, 3, 5]])
    assert efficiency(inputs).tolist() == pytest.approx([0.5, 0.25, 1.0, 0.0, 0.2])
    assert kept(build_rule("selection", "gfpo").keep(inputs)) == [0, 1, 2]


def test_gfpo_keeps_every_response_of_a_group_no_larger_than_k_and_breaks_ties_in_order():
    inputs = make_input([[1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]], lengths=[[3, 3], [2, 2, 2, 2, 2]])
    assert kept(build_rule("selection", "gfpo").keep(inputs)) == [0, 1, 2, 3, 4]


def test_topk_keeps_the_top_half_of_the_batch_by_mean_absolute_advantage():
    """a_i = (1/L_i) sum_l |A_il|; retain the top 50% of responses of the whole batch (Table 1)."""
    advantages = [1.5, -0.2, 0.0, -1.0, 0.0, 0.4, 0.0, 0.0, 0.0, 0.0]
    inputs = make_input([[1.0, 0.0, 0.0, 0.0, 1.0], [0.0] * 5], advantages=advantages)
    assert mean_abs_advantage(inputs).tolist() == pytest.approx([abs(a) for a in advantages])
    # 5 of 10: the four non-zero |A|, then the first zero in rollout order (ties keep order)
    assert kept(build_rule("selection", "topk").keep(inputs)) == [0, 1, 2, 3, 5]


def test_topk_ranks_across_groups_not_within_them():
    advantages = [2.0, 1.9, 1.8, 1.7, 1.6, 0.1, 0.1, 0.1, 0.1, 0.1]
    inputs = make_input([[0.0] * 5, [0.0] * 5], advantages=advantages)
    assert kept(build_rule("selection", "topk").keep(inputs)) == [0, 1, 2, 3, 4]  # all from group 1
