"""Every registered data policy runs through the same seam contract."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

import lab.policies  # noqa: F401  the lab's simulation-only policies run through the same contract
from tests.trainer_node.test_policy_fakes import CLUSTERS, FakeFeedback, FakeOracle, make_pool, run_step
from trainer_node.policies.base import (
    POLICIES,
    DataPolicy,
    StepRollouts,
    build_policy,
    parse_policy_options,
    policy_names,
)

# Options a policy cannot run without (everything else uses documented defaults).
REQUIRED_OPTIONS = {
    "oracle": {"domain_weights": {"algebra": 0.4, "geometry": 0.3, "logic": 0.2, "number": 0.1}}
}
SETTINGS = {"batch_size": 6, "rollouts_per_prompt": 4}


def make(name: str, seed: int = 0, **options):
    pool = make_pool(per_cluster=10)
    options = parse_policy_options({"name": name, **SETTINGS, **REQUIRED_OPTIONS.get(name, {}), **options})
    return build_policy(options, pool, np.random.default_rng(seed)), pool


def feedback_for(pool, seed: int = 0) -> FakeFeedback:
    values = {"algebra": 0.0, "geometry": 0.01, "logic": 0.03, "number": -0.01}
    return FakeFeedback(lambda g: g.cluster, values, dp_noise=0.002, seed=seed)


@pytest.mark.parametrize("name", policy_names())
def test_contract_five_steps(name):
    policy, pool = make(name)
    oracle = FakeOracle(pool, seed=3)
    feedback = feedback_for(pool)
    for step in range(5):
        record = run_step(policy, step, oracle, feedback)
        for round_requests in record.requests:
            indices = [r.index for r in round_requests]
            assert len(set(indices)) == len(indices), "a round must not request one prompt twice"
            for req in round_requests:
                assert isinstance(req.index, int) and 0 <= req.index < len(pool)
                assert isinstance(req.num_rollouts, int) and req.num_rollouts >= 1
        generated = {g.index: g for g in record.so_far.groups}
        for group in record.batch:
            assert group.index in generated, "training groups come from this step's generation"
            fresh = [r for r in group.rollouts if not r.reused]
            assert fresh == generated[group.index].rollouts, "generated rollouts are passed through unchanged"
            assert group.cluster == pool.clusters[group.index]
        assert len({g.index for g in record.batch}) == len(record.batch)
        for key, value in policy.metrics().items():
            assert isinstance(key, str)
            assert type(value) is float and math.isfinite(value), f"{name}: metric {key}={value!r}"


@pytest.mark.parametrize("name", policy_names())
def test_contract_state_roundtrip_reproduces_requests(name):
    policy, pool = make(name, seed=11)
    oracle = FakeOracle(pool, seed=5)
    feedback = feedback_for(pool, seed=1)
    for step in range(4):
        run_step(policy, step, oracle, feedback)
    saved = json.loads(json.dumps(policy.state_dict()))  # must survive JSON
    rng_state = copy.deepcopy(policy.rng.bit_generator.state)
    oracle_twin, feedback_twin = copy.deepcopy(oracle), copy.deepcopy(feedback)

    resumed, _ = make(name, seed=999)
    resumed.load_state_dict(saved)
    resumed.rng.bit_generator.state = rng_state
    for step in range(4, 8):
        a = run_step(policy, step, oracle, feedback)
        b = run_step(resumed, step, oracle_twin, feedback_twin)
        assert a.requests == b.requests
        assert [g.index for g in a.batch] == [g.index for g in b.batch]
    assert json.dumps(policy.state_dict()) == json.dumps(resumed.state_dict())


@pytest.mark.parametrize("name", policy_names())
def test_contract_unknown_option_names_key_and_lists_valid(name):
    with pytest.raises(ValueError) as err:
        make(name, no_such_option=1)
    assert "no_such_option" in str(err.value) and "valid options" in str(err.value)


@pytest.mark.parametrize("name", policy_names())
def test_contract_policy_gets_its_typed_options_and_declares_capabilities(name):
    policy, _ = make(name)
    assert isinstance(policy.options, POLICIES.options_model(name)) and policy.name == name
    assert policy.options.batch_size == SETTINGS["batch_size"]
    cls = POLICIES.get(name)
    assert issubclass(cls, DataPolicy)
    assert isinstance(cls.uses_target_feedback, bool) and isinstance(cls.simulation_only, bool)


def test_only_the_oracle_is_simulation_only():
    assert [name for name in policy_names() if POLICIES.get(name).simulation_only] == ["oracle"]


def test_unknown_policy_name_lists_known():
    with pytest.raises(ValueError, match="known: .*uniform"):
        build_policy({"name": "nope"}, make_pool(), np.random.default_rng(0))


@pytest.mark.parametrize("name", ["dapo", "greso", "l2rr"])
def test_wrong_option_type_names_key(name):
    key = {"dapo": "max_num_gen_batches", "greso": "p_easy", "l2rr": "eta_q"}[name]
    with pytest.raises(ValueError, match=key):
        make(name, **{key: True})


def test_oracle_requires_known_domains():
    pool = make_pool(per_cluster=2)
    with pytest.raises(ValueError, match="domain_weights"):
        build_policy({"name": "oracle"}, pool, np.random.default_rng(0))
    with pytest.raises(ValueError, match="chemistry"):
        build_policy({"name": "oracle", "domain_weights": {"chemistry": 1.0}}, pool, np.random.default_rng(0))
    with pytest.raises(ValueError, match="domain_weights"):
        parse_policy_options({"name": "oracle", "domain_weights": {"algebra": -1.0}})


def test_oracle_follows_domain_weights():
    policy, pool = make("oracle")
    counts = dict.fromkeys(CLUSTERS, 0)
    for step in range(300):
        for req in policy.next_requests(step, StepRollouts()):
            counts[pool.clusters[req.index]] += 1
    total = sum(counts.values())
    for cluster, weight in REQUIRED_OPTIONS["oracle"]["domain_weights"].items():
        assert abs(counts[cluster] / total - weight) < 0.03
