"""GRESO: skip probabilities, exploration-probability updates, adaptive sampling batch size."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer_node.test_policy_fakes import FakeOracle, make_pool, rollouts_for, run_step
from trainer_node.policies.base import Group, StepRollouts, build_policy
from trainer_node.policies.greso import adaptive_batch_size, skip_probability, step_probability


def greso(pool, batch_size=8, n=4, seed=0, **options):
    return build_policy(
        {"name": "greso", "batch_size": batch_size, "rollouts_per_prompt": n, **options}, pool, np.random.default_rng(seed)
    )


def group(pool, index, rewards):
    return Group(index, pool.clusters[index], rollouts_for(index, rewards))


@pytest.mark.parametrize(
    ("easy", "hard", "p_easy", "p_hard", "expected"),
    [
        (0, 0, 0.5, 0.5, 0.0),  # no history / last entry mixed: never skipped
        (1, 0, 0.5, 0.5, 0.5),  # 1 - 0.5
        (3, 0, 0.5, 0.5, 0.875),  # 1 - 0.5^3
        (10, 0, 0.5, 0.5, 0.99),  # 0.5^10 < 0.01 floor
        (0, 2, 0.5, 0.8, 1 - 0.64),  # hard uses p_hard: 1 - 0.8^2
        (0, 1, 0.3, 0.9, 1 - 0.9),
    ],
)
def test_skip_probability(easy, hard, p_easy, p_hard, expected):
    assert skip_probability(easy, hard, p_easy, p_hard, 0.01) == pytest.approx(expected)


def test_history_streaks_follow_the_most_recent_run():
    pool = make_pool(per_cluster=2)
    policy = greso(pool)
    # prompt 0: easy, easy, mixed, easy, easy -> trailing easy run z = 2
    for rewards in ([1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]):
        policy.observe(0, [group(pool, 0, rewards)])
    # prompt 1: hard three times -> z = 3 with p_hard
    for _ in range(3):
        policy.observe(0, [group(pool, 1, [0, 0, 0, 0])])
    # prompt 2: hard then easy -> easy run of 1
    policy.observe(0, [group(pool, 2, [0.1, 0.1, 0.1, 0.1])])  # mean 0.1 <= 0.11: hard
    policy.observe(0, [group(pool, 2, [1, 1, 0.98, 1])])  # mean 0.995 >= 0.98: easy
    probs = policy.skip_probabilities(np.array([0, 1, 2, 3]))
    assert probs[0] == pytest.approx(1 - max(policy.p_easy**2, 0.01))
    assert probs[1] == pytest.approx(1 - max(policy.p_hard**3, 0.01))
    assert probs[2] == pytest.approx(1 - max(policy.p_easy, 0.01))
    assert probs[3] == 0.0
    assert (policy.easy_streak[:3].tolist(), policy.hard_streak[:3].tolist()) == ([2, 0, 1], [0, 3, 0])


def test_exploration_probabilities_move_toward_targets():
    # alpha = 0.25: easy target 1/12, hard target 1/6.
    # too many easy prompts: skip more (smaller keep base); too few: skip less
    assert step_probability(0.5, 0.10, 0.25 / 3, 0.01, 0.05, 0.95) == pytest.approx(0.49)
    assert step_probability(0.5, 0.05, 0.25 / 3, 0.01, 0.05, 0.95) == pytest.approx(0.51)
    assert step_probability(0.05, 1.0, 0.1, 0.01, 0.05, 0.95) == 0.05  # clipped at p_min
    assert step_probability(0.95, 0.0, 0.1, 0.01, 0.05, 0.95) == 0.95  # clipped at p_max

    pool = make_pool(per_cluster=3)  # 12 prompts
    policy = greso(pool)
    groups = [group(pool, i, [1, 1, 1, 1]) for i in range(3)]  # 3/12 easy >= 1/12
    groups += [group(pool, 3, [0, 0, 0, 0])]  # 1/12 hard < 1/6
    groups += [group(pool, i, [1, 0, 1, 0]) for i in range(4, 12)]
    policy.observe(0, groups)
    assert (policy.p_easy, policy.p_hard) == (pytest.approx(0.49), pytest.approx(0.51))
    assert policy.metrics()["easy_frac"] == 0.25


def test_adaptive_batch_size_formula():
    assert adaptive_batch_size(target=16, have=6, zero_var_ratio=0.5, margin=1.25) == 25  # int(10/0.5*1.25)
    assert adaptive_batch_size(target=16, have=12, zero_var_ratio=0.75, margin=1.25) == 20
    assert adaptive_batch_size(target=16, have=15, zero_var_ratio=0.0, margin=1.25) == 1
    assert adaptive_batch_size(target=16, have=0, zero_var_ratio=1.0, margin=1.25) > 10**6  # capped by caller


def test_rounds_use_adaptive_size_then_stop_after_last_round():
    pool = make_pool(per_cluster=25)  # 100 prompts; B = 8 -> sampling 12, min 2
    rates = np.where(np.arange(100) % 3 == 0, 0.5, 0.0)
    oracle = FakeOracle(pool, rates=rates, seed=4)
    policy = greso(pool, batch_size=8, n=16, max_num_gen_batches=20)
    assert (policy.sampling_batch_size, policy.min_sampling_batch_size) == (12, 2)

    so_far = StepRollouts()
    first = policy.next_requests(0, so_far)
    assert len(first) == 12  # no history yet: nothing skipped
    so_far.add(oracle(first, 0))
    last_size, last_round, rounds = 12, False, 1
    while True:
        have = sum(not g.zero_variance for g in so_far.groups)
        this_round = so_far.groups[-last_size:]
        rho = sum(g.zero_variance for g in this_round) / len(this_round)
        requests = policy.next_requests(0, so_far)
        if have >= 8 or last_round:
            assert requests == []
            break
        estimate = int((8 - have) / max(1 - rho, 1e-9) * 1.25)
        assert len(requests) == max(min(estimate, 12), 2)
        last_round = estimate <= 12
        last_size = len(requests)
        so_far.add(oracle(requests, 0))
        rounds += 1
    assert rounds >= 2, "the scenario must exercise at least one adaptive round"
    batch = policy.training_groups(0, so_far)
    assert len(batch) == min(8, sum(not g.zero_variance for g in so_far.groups))


def test_skipped_prompts_are_not_rolled_out():
    pool = make_pool(per_cluster=25)
    policy = greso(pool, batch_size=8)
    policy.easy_streak[:50] = 30  # keep probability 1% (the floor)
    requests = policy.next_requests(0, StepRollouts())
    assert len(requests) == 12
    assert sum(r.index < 50 for r in requests) <= 2
    assert policy.metrics()["p_easy"] == 0.5


def test_full_step_trains_on_informative_groups_only():
    pool = make_pool(per_cluster=25)
    policy = greso(pool, batch_size=8, n=8)
    record = run_step(policy, 0, FakeOracle(pool, seed=9))
    assert all(not g.zero_variance for g in record.batch) and len(record.batch) <= 8


def _reference_walk(policy, size: int, exclude: set[int], rng: np.random.Generator) -> list[int]:
    """The O(pool) reference: a full uniform permutation of the eligible prompts, walked in order."""
    eligible = np.setdiff1d(np.arange(len(policy.pool)), np.fromiter(exclude, dtype=np.int64))
    order = rng.permutation(eligible)
    keep = rng.random(len(order)) >= policy.skip_probabilities(order)
    return [int(i) for i, k in zip(order, keep) if k][:size]


@pytest.mark.parametrize("per_cluster", [100, 6])  # 400 prompts: lazy chunks; 24: the permutation fallback
def test_lazy_walk_keeps_the_distribution_of_the_full_permutation(per_cluster):
    pool = make_pool(per_cluster=per_cluster)
    policy = greso(pool, batch_size=4)
    easy = np.arange(0, len(pool), 2)  # every other prompt: easy three times, skipped w.p. 1 - 0.5^3
    for _ in range(3):
        policy.observe(0, [group(pool, int(i), [1, 1, 1, 1]) for i in easy])
    policy.p_easy = 0.5
    exclude = {1, 3}
    size, draws = 5, 4000
    fast_counts, slow_counts = np.zeros(len(pool)), np.zeros(len(pool))
    fast_first, slow_first = np.zeros(len(pool)), np.zeros(len(pool))
    slow_rng = np.random.default_rng(99)
    for _ in range(draws):
        policy._skipped = set()
        fast = policy._draw_unskipped(size, set(exclude))
        slow = _reference_walk(policy, size, exclude, slow_rng)
        assert len(fast) == len(set(fast)) == size and not set(fast) & exclude
        fast_counts[fast] += 1
        slow_counts[slow] += 1
        fast_first[fast[0]] += 1
        slow_first[slow[0]] += 1
    is_easy = np.zeros(len(pool), dtype=bool)
    is_easy[easy] = True
    for fast_c, slow_c, total in ((fast_counts, slow_counts, size * draws), (fast_first, slow_first, draws)):
        for mask in (is_easy, ~is_easy):  # share of picks that went to easy (often skipped) prompts
            p_fast, p_slow = fast_c[mask].sum() / total, slow_c[mask].sum() / total
            sd = np.sqrt(2 * p_slow * (1 - p_slow) / total)
            assert abs(p_fast - p_slow) <= 5 * sd
        per_prompt = (fast_c + slow_c) / (2 * total)
        sd = np.sqrt(2 * per_prompt * (1 - per_prompt) / total)
        assert np.all(np.abs(fast_c - slow_c) / total <= 5 * sd + 1e-12)


def test_walk_records_skipped_prompts_and_stops_when_the_pool_runs_out():
    pool = make_pool(per_cluster=3)  # 12 prompts
    policy = greso(pool, batch_size=4)
    chosen = policy._draw_unskipped(50, {0, 1})
    assert sorted(chosen) == list(range(2, 12))  # nothing is skipped without history
    assert policy._skipped == set()
