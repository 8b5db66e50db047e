"""DAPO dynamic sampling: zero-variance filtering, accumulation across rounds, the round cap."""

from __future__ import annotations

import numpy as np

from tests.trainer_node.test_policy_fakes import FakeOracle, make_pool, rollouts_for, run_step
from trainer_node.policies.base import Group, build_policy


def dapo(pool, batch_size=4, n=4, seed=0, **options):
    return build_policy(
        {"name": "dapo", "batch_size": batch_size, "rollouts_per_prompt": n, **options}, pool, np.random.default_rng(seed)
    )


def test_accumulates_rounds_until_batch_of_informative_groups():
    pool = make_pool(per_cluster=10)  # 40 prompts
    rates = np.where(np.arange(40) % 4 == 0, 0.5, 0.0)  # 1 in 4 prompts can be informative
    oracle = FakeOracle(pool, rates=rates, seed=2)
    policy = dapo(pool, batch_size=3, n=8, max_num_gen_batches=10)
    record = run_step(policy, 0, oracle)

    groups = record.so_far.groups
    assert all(len(r) == 3 for r in record.requests)  # gen batch = batch_size * 1.0
    kept_after = [
        sum(not g.zero_variance for g in groups[: 3 * (k + 1)]) for k in range(len(record.requests))
    ]
    assert kept_after[-1] >= 3 and all(k < 3 for k in kept_after[:-1]), "stops at the first round reaching B"
    assert len({g.index for g in groups}) == len(groups), "no prompt is rolled out twice in a step"
    informative = [g for g in groups if not g.zero_variance]
    assert [g.index for g in record.batch] == [g.index for g in informative[:3]]  # first B kept, in order
    metrics = policy.metrics()
    assert metrics["rounds"] == len(record.requests) and metrics["cap_hit"] == 0.0


def test_filter_drops_exactly_the_zero_variance_groups():
    pool = make_pool(per_cluster=2)
    policy = dapo(pool, batch_size=8)

    def scripted(requests, step):
        patterns = {0: [1, 1, 1, 1], 1: [0, 0, 0, 0], 2: [1, 0, 0, 0], 3: [0.5, 0.5, 0.5, 0.5]}
        return [
            Group(r.index, pool.clusters[r.index], rollouts_for(r.index, patterns[r.index % 4]))
            for r in requests
        ]

    record = run_step(policy, 0, scripted)
    assert {g.index % 4 for g in record.batch} == {2}


def test_cap_hit_trains_on_what_it_has_and_counts():
    pool = make_pool(per_cluster=10)
    rates = np.zeros(40)
    rates[7] = 0.5
    oracle = FakeOracle(pool, rates=rates, seed=0)
    policy = dapo(pool, batch_size=4, n=16, gen_batch_multiplier=1.5)
    record = run_step(policy, 0, oracle)
    assert len(record.requests) == 4  # max_num_gen_batches default
    assert all(len(r) == 6 for r in record.requests)  # ceil(4 * 1.5)
    assert len(record.batch) <= 1
    assert policy.metrics()["cap_hit"] == 1.0
    run_step(policy, 1, oracle)
    assert policy.metrics()["cap_hits_total"] == 2.0
    assert policy.state_dict() == {"cap_hits_total": 2}
