"""DataFlex-RL configurations are validated when the trainer config loads: a typo or a value out
of range in a mixture policy's [policy] table or in grpo.selection / grpo.reweighting fails with
an error that names the field (and the fix where there is one), before anything runs."""

from __future__ import annotations

import pytest

from trainer_node.config import ConfigError, parse_config

TINY = {"model": {"tiny": True}}
MIXTURES = ("static", "reward_gap", "dump_ucb", "tscl")
ADAPTIVE = ("reward_gap", "dump_ucb", "tscl")


def error_of(raw: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    return str(caught.value)


@pytest.mark.parametrize("name", MIXTURES)
def test_every_mixture_loads_from_its_name_with_dataflex_defaults(name):
    policy = parse_config({**TINY, "policy": {"name": name}}).to_json()["policy"]
    assert policy["name"] == name
    if name in ADAPTIVE:  # DataFlex-RL's gen_jobs_mix.sh: T 1.0, floor 0.05, window 50, warm-up 1, every step
        assert {k: policy[k] for k in ("temperature", "floor", "window", "warmup_steps", "update_every")} == {
            "temperature": 1.0, "floor": 0.05, "window": 50, "warmup_steps": 1, "update_every": 1}


@pytest.mark.parametrize("name", ADAPTIVE)
def test_a_mixture_option_typo_names_the_field_and_the_fix(name):
    message = error_of({**TINY, "policy": {"name": name, "temperatrue": 2.0}})
    assert f"policy.temperatrue: not an option of data policy '{name}'" in message
    assert "did you mean 'temperature'?" in message


@pytest.mark.parametrize(("name", "key", "value"), [
    ("reward_gap", "floor", 1.0),         # a floor of 1 would leave no mixture to adapt
    ("reward_gap", "temperature", 0.0),   # T > 0
    ("dump_ucb", "exploration", -1.0),    # the UCB weight c is not negative
    ("tscl", "window", 0),                # at least one rollout per domain window
    ("tscl", "update_every", 0),
])
def test_a_mixture_option_out_of_range_names_the_field(name, key, value):
    message = error_of({**TINY, "policy": {"name": name, key: value}})
    assert f"policy.{key}:" in message and "not an option" not in message


def test_a_mixture_does_not_accept_another_familys_options():
    message = error_of({**TINY, "policy": {"name": "static", "floor": 0.1}})
    assert "policy.floor: not an option of data policy 'static'" in message


@pytest.mark.parametrize(("seam", "rule", "key", "value"), [
    ("selection", "gfpo", "keep", 0),
    ("selection", "topk", "fraction", 1.5),
    ("selection", "maxvar", "keep_fraction", 0.0),
    ("reweighting", "per", "alpha", -0.5),
    ("reweighting", "softmax", "temperature", 0.0),
])
def test_an_update_rule_option_out_of_range_names_the_field(seam, rule, key, value):
    message = error_of({**TINY, "grpo": {seam: {"name": rule, key: value}}})
    assert f"grpo.{seam}.{key}:" in message and "not an option" not in message


def test_a_mixture_name_is_not_an_update_rule_and_a_rule_is_not_a_policy():
    assert "grpo.selection.name: unknown selection rule 'reward_gap'" in error_of(
        {**TINY, "grpo": {"selection": "reward_gap"}})
    assert "policy.name" in error_of({**TINY, "policy": {"name": "gfpo"}})
