"""AR3PO: staged rollout stops on the first correct response; reuse fills all-wrong groups."""

from __future__ import annotations

import json

import numpy as np

from tests.trainer_node.test_policy_fakes import make_pool, rollouts_for, run_step
from trainer_node.policies.base import Group, build_policy


def ar3po(pool, batch_size, n=8, seed=0, **options):
    return build_policy(
        {"name": "ar3po", "batch_size": batch_size, "rollouts_per_prompt": n, **options}, pool, np.random.default_rng(seed)
    )


class Scripted:
    """Rewards per prompt from a per-step script: prompt -> the sequence of its responses' rewards."""

    def __init__(self, pool, script):
        self.pool, self.script, self.cursor = pool, script, {}

    def __call__(self, requests, step):
        groups = []
        for req in requests:
            start = self.cursor.get((step, req.index), 0)
            rewards = self.script(step, req.index)[start : start + req.num_rollouts]
            assert len(rewards) == req.num_rollouts
            self.cursor[(step, req.index)] = start + req.num_rollouts
            groups.append(
                Group(req.index, self.pool.clusters[req.index], rollouts_for(req.index, rewards, start))
            )
        return groups


def test_stages_stop_on_first_correct_response():
    pool = make_pool(per_cluster=1)  # 4 prompts, all sampled with B = 4
    script = {
        0: [1, 1, 0, 0, 0, 0, 0, 0],  # correct in stage 1 -> 2 responses
        1: [0, 0, 0, 1, 1, 1, 1, 1],  # first correct in stage 2 -> 4
        2: [0, 0, 0, 0, 0, 0, 1, 0],  # stage 4 -> 8
        3: [0, 0, 0, 0, 0, 0, 0, 0],  # never -> max_rollouts = n = 8
    }
    policy = ar3po(pool, batch_size=4)
    record = run_step(policy, 0, Scripted(pool, lambda step, i: script[i]))
    generated = {g.index: g.generated for g in record.so_far.groups}
    assert generated == {0: 2, 1: 4, 2: 8, 3: 8}
    assert [len(r) for r in record.requests] == [4, 3, 2, 2]
    assert all(req.num_rollouts == 2 for r in record.requests for req in r)
    # 0 is all-correct (zero variance), 3 is all-wrong with an empty buffer: neither trains.
    assert sorted(g.index for g in record.batch) == [1, 2]
    assert policy.metrics()["rollouts_generated"] == 22.0


def test_stage_sizes_respect_max_rollouts():
    pool = make_pool(per_cluster=1)
    policy = ar3po(pool, batch_size=4, n=8, stage_rollouts=3, max_rollouts=7)
    record = run_step(policy, 0, Scripted(pool, lambda step, i: [0] * 7))
    assert [[req.num_rollouts for req in r] for r in record.requests] == [[3] * 4, [3] * 4, [1] * 4]
    assert all(g.generated == 7 for g in record.so_far.groups)


def test_reuse_fills_all_wrong_groups_and_is_not_counted_as_generated():
    pool = make_pool(per_cluster=1)
    # step 0: every prompt is answered correctly on its first response; step 1: never.

    def script(step, index):
        return ([1, 0] + [0] * 6) if step == 0 else [0] * 8

    oracle = Scripted(pool, script)
    policy = ar3po(pool, batch_size=4)
    first = run_step(policy, 0, oracle)
    assert len(first.batch) == 4 and policy.metrics()["buffer_size"] == 4.0
    buffered = {g.index: g.rollouts[0] for g in first.so_far.groups}  # the correct one

    # resume between steps: the replay buffer is part of the JSON state
    resumed = ar3po(pool, batch_size=4)
    resumed.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    resumed.rng.bit_generator.state = policy.rng.bit_generator.state
    for p in (policy, resumed):
        second = run_step(p, 1, Scripted(pool, script))
        assert second.so_far.rollouts_generated == 4 * 8
        assert all(not r.reused for g in second.so_far.groups for r in g.rollouts), "so_far is not mutated"
        assert len(second.batch) == 4
        for g in second.batch:
            reused = [r for r in g.rollouts if r.reused]
            assert len(reused) == 1 and g.generated == 8 and len(g.rollouts) == 9
            original = buffered[g.index]
            assert (reused[0].text, reused[0].reward, reused[0].completion_ids) == (
                original.text,
                original.reward,
                original.completion_ids,
            )
            assert not g.zero_variance
        assert p.metrics()["reused"] == 4.0


def test_buffer_keeps_latest_generated_correct_response():
    pool = make_pool(per_cluster=1)
    policy = ar3po(pool, batch_size=4)
    policy.observe(0, [Group(0, pool.clusters[0], rollouts_for(0, [1, 0, 1, 0]))])
    assert policy.buffer[0].text == "p0-r2"
    policy.observe(1, [Group(0, pool.clusters[0], rollouts_for(0, [0, 0]))])
    assert policy.buffer[0].text == "p0-r2"  # an all-wrong group does not evict it
