import json

import pytest

from trainer_node.cli import DEFAULT_CONFIG
from trainer_node.config import ConfigError, load_config, parse_config

TINY = {"model": {"tiny": True}}


def error_of(raw, **overrides):
    with pytest.raises(ConfigError) as info:
        parse_config(raw, overrides)
    return str(info.value)


def test_packaged_default_config_loads_and_overrides_apply(tmp_path):
    config = load_config(DEFAULT_CONFIG, {"run.steps": 5, "run.out_dir": str(tmp_path), "run.seed": None})
    assert config.run.steps == 5 and config.run.seed == 0 and config.policy.name == "uniform"
    assert config.grpo.eps_low == 0.2 and config.grpo.eps_high == 0.28 and config.grpo.kl_coef == 0.0
    saved = json.loads(config.save_resolved(tmp_path).read_text())
    assert saved["run"]["steps"] == 5 and saved["grpo"]["betas"] == [0.9, 0.999]


def test_unknown_policy_names_the_field_and_lists_known():
    message = error_of({**TINY, "policy": {"name": "uniformm"}})
    assert "policy.name" in message and "unknown data policy 'uniformm'" in message and "uniform" in message


def test_negative_lr_names_the_field():
    message = error_of({**TINY, "grpo": {"lr": -0.1}})
    assert "grpo.lr" in message and "greater than 0" in message and "-0.1" in message


def test_unknown_key_names_the_field():
    message = error_of({**TINY, "rollout": {"max_new_token": 8}})
    assert "rollout.max_new_token" in message and "unknown key" in message


def test_model_needs_exactly_one_source_and_cross_checks():
    assert "model" in error_of({})
    assert "exactly one" in error_of({"model": {"tiny": True, "path": "x"}})
    message = error_of({**TINY, "grpo": {"overlong_buffer": 8}, "rollout": {"max_new_tokens": 8}})
    assert "grpo.overlong_buffer" in message
    assert "grpo.advantage" in error_of({**TINY, "grpo": {"advantage": "ppo"}})
    assert "grpo.loss_aggregation" in error_of({**TINY, "grpo": {"loss_aggregation": "sum"}})


def test_bad_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


@pytest.mark.parametrize(("key", "value"), [("selection.every", -1), ("selection.max_candidates", 1)])
def test_bad_selection_settings_name_the_field(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(DEFAULT_CONFIG, {key: value})
