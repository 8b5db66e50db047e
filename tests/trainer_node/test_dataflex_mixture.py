"""Calibration smoke tests of DataFlex-RL's four domain mixtures (seed 001, Table 1; Eq. 3:
the policy chooses p_t(d), the share of prompts drawn from domain d): each mixture's signal and
its shares on hand-made groups. The policy contract (test_policy_contract.py) runs them too."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer_node.test_policy_fakes import make_pool, rollouts_for
from trainer_node.policies.base import Group, StepRollouts, build_policy
from trainer_node.policies.dump_ucb import ucb_scores
from trainer_node.policies.mixture import allocate, group_abs_advantages, softmax_with_floor

DOMAINS = ("logic", "math", "text")


def make(name: str, batch_size: int = 9, **options):
    pool = make_pool(per_cluster=20, clusters=DOMAINS)
    policy = build_policy({"name": name, "batch_size": batch_size, "rollouts_per_prompt": 5, **options}, pool,
                          np.random.default_rng(0))
    return policy, pool


def groups_with(pool, rewards_by_domain: dict[str, list[list[float]]]) -> list[Group]:
    """Groups of the given rewards, each on a distinct prompt of its domain."""
    groups = []
    for domain, groups_rewards in rewards_by_domain.items():
        indices = [i for i, e in enumerate(pool.examples) if e.domain == domain]
        for index, rewards in zip(indices, groups_rewards):
            groups.append(Group(index, domain, rollouts_for(index, rewards)))
    return groups


def drawn_domains(policy, pool, step: int = 0) -> list[str]:
    return [pool.examples[r.index].domain for r in policy.next_requests(step, StepRollouts())]


def test_allocate_rounds_by_largest_remainder_and_breaks_ties_at_random():
    assert allocate(np.array([0.5, 0.3, 0.2]), 10, np.random.default_rng(0)).tolist() == [5, 3, 2]
    assert allocate(np.array([0.45, 0.35, 0.2]), 4, np.random.default_rng(0)).tolist() == [2, 1, 1]
    rng = np.random.default_rng(1)
    totals = sum(allocate(np.full(3, 1 / 3), 8, rng) for _ in range(3000))
    assert totals.sum() == 8 * 3000 and np.all(np.abs(totals / 3000 - 8 / 3) < 0.05)


def test_softmax_with_floor_is_dataflex_rls_mixer_output():
    p = softmax_with_floor(np.array([0.0, 0.6, 0.3]), 1.0, 0.05)
    expected = np.exp([0.0, 0.6, 0.3]) / np.exp([0.0, 0.6, 0.3]).sum()
    assert p == pytest.approx(expected)
    floored = softmax_with_floor(np.array([0.0, 10.0, 0.0]), 1.0, 0.05)
    raw = np.maximum(np.exp([-10.0, 0.0, -10.0]) / np.exp([-10.0, 0.0, -10.0]).sum(), 0.05)
    assert floored == pytest.approx(raw / raw.sum()) and floored.min() > 0.04


def test_static_draws_an_equal_share_of_every_domain_every_step():
    """p_t(d) = 1/3 (Table 1): with batch 9, exactly 3 prompts per domain, every step."""
    policy, pool = make("static")
    for step in range(5):
        domains = drawn_domains(policy, pool, step)
        assert sorted(domains.count(d) for d in DOMAINS) == [3, 3, 3]
        policy.observe(step, groups_with(pool, {"math": [[1.0] * 5] * 3, "logic": [[0.0] * 5] * 3}))
    assert policy.metrics()["share/math"] == pytest.approx(1 / 3)


def test_reward_gap_favours_the_lagging_domain():
    """p(d) = softmax((max rbar - rbar_d) / T), floor 0.05 (DataFlex-RL's RewardGapMixer)."""
    policy, pool = make("reward_gap")
    assert policy.proportions == pytest.approx([1 / 3] * 3)  # the equal prior before any step
    policy.observe(0, groups_with(pool, {"logic": [[0.0, 0.0, 0.0, 0.0, 1.0]],   # rbar 0.2
                                         "math": [[1.0, 1.0, 1.0, 1.0, 0.0]],    # rbar 0.8
                                         "text": [[1.0, 0.0, 1.0, 0.0, 0.5]]}))  # rbar 0.5
    gap = np.array([0.6, 0.0, 0.3])
    assert policy.proportions == pytest.approx(np.exp(gap) / np.exp(gap).sum())
    assert policy.metrics()["signal/logic"] == pytest.approx(0.2)
    counts = np.zeros(3)
    for step in range(1, 400):
        domains = drawn_domains(policy, pool, step)
        counts += [domains.count(d) for d in DOMAINS]
    assert counts / counts.sum() == pytest.approx(policy.proportions, abs=0.02)


def test_reward_gap_reads_only_the_last_window_of_rollouts():
    policy, pool = make("reward_gap", window=5)
    policy.observe(0, groups_with(pool, {"logic": [[1.0] * 5], "math": [[1.0] * 5], "text": [[1.0] * 5]}))
    policy.observe(1, groups_with(pool, {"logic": [[0.0] * 5]}))  # logic's window now holds only zeros
    assert policy.stats.mean_reward().tolist() == [0.0, 1.0, 1.0]
    assert np.argmax(policy.proportions) == 0


def test_dump_ucb_adds_an_exploration_bonus_to_the_mean_absolute_advantage():
    """score(d) = abar_d + c sqrt(2 ln(N + 1) / (n_d + 1)); p = softmax(score / T) with a floor."""
    policy, pool = make("dump_ucb")
    policy.observe(0, groups_with(pool, {"logic": [[1.0, 0.0, 1.0, 0.0, 1.0]] * 2,  # 10 rollouts, |A| > 0
                                         "math": [[1.0] * 5],                       # 5 rollouts, |A| = 0
                                         "text": [[0.0] * 5] * 3}))                 # 15 rollouts, |A| = 0
    abs_adv = group_abs_advantages(np.array([1.0, 0.0, 1.0, 0.0, 1.0]))
    assert abs_adv == pytest.approx(np.abs([0.4, -0.6, 0.4, -0.6, 0.4]) / (np.std([1, 0, 1, 0, 1], ddof=1) + 1e-6))
    counts = np.array([10.0, 5.0, 15.0])
    scores = np.array([abs_adv.mean(), 0.0, 0.0]) + np.sqrt(2 * np.log(31.0) / (counts + 1))
    assert policy.signal() == pytest.approx(scores)
    assert ucb_scores(np.array([abs_adv.mean(), 0.0, 0.0]), counts, 1.0) == pytest.approx(scores)
    assert policy.proportions == pytest.approx(np.exp(scores) / np.exp(scores).sum())
    assert policy.proportions[1] > policy.proportions[2]  # fewer samples: a larger bonus


def test_tscl_favours_the_domain_whose_reward_curve_moves_fastest():
    """Progress s_d = |least-squares slope| of the per-step mean reward; p = softmax(s / T)."""
    policy, pool = make("tscl")
    curves = {"logic": [0.1, 0.4, 0.7], "math": [0.5, 0.5, 0.5], "text": [0.9, 0.8, 0.7]}
    for step in range(3):
        policy.observe(step, groups_with(pool, {d: [[c[step]] * 5] for d, c in curves.items()}))
    slopes = np.array([0.3, 0.0, -0.1])
    assert policy.stats.reward_slope(10) == pytest.approx(slopes)
    assert policy.signal() == pytest.approx(np.abs(slopes))
    assert policy.proportions == pytest.approx(np.exp(np.abs(slopes)) / np.exp(np.abs(slopes)).sum())
    signed, _ = make("tscl", signed=True)
    for step in range(3):
        signed.observe(step, groups_with(pool, {d: [[c[step]] * 5] for d, c in curves.items()}))
    assert signed.signal() == pytest.approx([0.3, 0.0, 0.0])


def test_warmup_keeps_the_equal_mixture_and_update_every_spaces_the_updates():
    policy, pool = make("reward_gap", warmup_steps=2, update_every=2)
    lagging = {"logic": [[0.0] * 5], "math": [[1.0] * 5], "text": [[1.0] * 5]}
    policy.observe(0, groups_with(pool, lagging))
    assert policy.proportions == pytest.approx([1 / 3] * 3)  # still warming up
    policy.observe(1, groups_with(pool, lagging))
    assert policy.proportions[0] > 0.5
    shares = policy.proportions.copy()
    policy.observe(2, groups_with(pool, {"logic": [[1.0] * 5] * 20}))
    assert policy.proportions == pytest.approx(shares)  # step 3 is not a multiple of 2


def test_a_domain_short_of_prompts_is_topped_up_from_the_others():
    pool = make_pool(per_cluster=2, clusters=DOMAINS)
    policy = build_policy({"name": "reward_gap", "batch_size": 6, "rollouts_per_prompt": 5}, pool,
                          np.random.default_rng(0))
    policy.proportions = np.array([0.9, 0.05, 0.05])
    indices = [r.index for r in policy.next_requests(0, StepRollouts())]
    assert len(indices) == 6 and len(set(indices)) == 6


def test_mixture_state_refuses_another_pools_domains():
    policy, _ = make("dump_ucb")
    state = policy.state_dict()
    other = build_policy({"name": "dump_ucb", "batch_size": 4, "rollouts_per_prompt": 5}, make_pool(per_cluster=3),
                         np.random.default_rng(0))
    with pytest.raises(ValueError, match="domains"):
        other.load_state_dict(state)
