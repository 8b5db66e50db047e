"""The paper's Table 6 baselines (trainer_node/policies/target_guided.py): from released
accuracies only, thresholding drops a harmful cluster and the softmax weighs the helpful one."""

import numpy as np
import pytest

from tests.trainer_node.test_policy_fakes import FakeFeedback, FakeOracle, make_pool, run_step
from trainer_node.policies.base import build_policy, parse_policy_options

VALUES = {"algebra": 0.01, "geometry": 0.02, "logic": 0.04, "number": -0.04}  # number harms the target


def _run(name, steps=12, **options):
    pool = make_pool(per_cluster=20)
    parsed = parse_policy_options({"name": name, "batch_size": 8, "rollouts_per_prompt": 4, "max_staleness": 0,
                                   **options})
    policy = build_policy(parsed, pool, np.random.default_rng(0))
    oracle = FakeOracle(pool, seed=1)
    feedback = FakeFeedback(lambda g: g.cluster, VALUES, dp_noise=0.002, seed=2)
    for step in range(steps):
        run_step(policy, step, oracle, feedback)
    return policy, feedback


def test_thresholding_stops_sampling_a_cluster_whose_effect_is_below_the_threshold():
    policy, feedback = _run("target_threshold")
    q = dict(zip(policy.cluster_names, policy.q()))
    assert feedback.calls and policy.feedback_queries > 0
    assert policy.active().tolist() == [name != "number" for name in policy.cluster_names]
    assert q["number"] == pytest.approx(0.05 / 4)  # the floor only: drawn now and then, measured again
    assert q["algebra"] == q["logic"] == q["geometry"]  # the rest share q uniformly


def test_softmax_weights_follow_the_latest_effects_without_accumulating():
    policy, _ = _run("target_softmax")
    q = dict(zip(policy.cluster_names, policy.q()))
    assert q["logic"] > q["geometry"] > q["algebra"] > q["number"]
    effects = policy.effects.copy()
    expected = np.exp(effects / 0.02) / np.exp(effects / 0.02).sum()
    assert policy.q() == pytest.approx(0.95 * expected + 0.05 / 4)  # a function of the latest effects only


def test_the_baselines_have_l2rrs_source_side_parts_off_and_resume_exactly():
    policy, _ = _run("target_softmax", steps=3)
    assert not policy.options.waste_penalty and not policy.options.rollout_allocation
    assert policy.options.oversample == 1.0
    twin = build_policy(policy.options, make_pool(per_cluster=20), np.random.default_rng(0))
    twin.load_state_dict(policy.state_dict())
    assert twin.q().tolist() == policy.q().tolist()
    with pytest.raises(ValueError, match="effects"):
        twin.load_state_dict({**policy.state_dict(), "effects": [0.0]})
