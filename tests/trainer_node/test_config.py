import ast
import importlib.metadata
import json
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from rlvr_core.configuration import undocumented_fields
from trainer_node.cli import DEFAULT_CONFIG
from trainer_node.config import ConfigError, TrainConfig, load_config, parse_config
from trainer_node.grpo.settings import GRPOSettings
from trainer_node.policies import base
from trainer_node.policies.l2rr import L2rrOptions
from trainer_node.policies.options import PolicyOptions

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
    assert "rollout.max_new_token: unknown setting" in message and "train_default.toml" in message


def test_model_needs_exactly_one_source_and_cross_checks():
    assert "model" in error_of({})
    assert "exactly one" in error_of({"model": {"tiny": True, "path": "x"}})
    message = error_of({**TINY, "grpo": {"overlong_buffer": 8}, "rollout": {"max_new_tokens": 8}})
    assert "grpo.overlong_buffer" in message
    assert "grpo.advantage" in error_of({**TINY, "grpo": {"advantage": "ppo"}})
    assert "grpo.loss_aggregation" in error_of({**TINY, "grpo": {"loss_aggregation": "sum"}})


def test_bad_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


@pytest.mark.parametrize(("key", "value"), [("selection.every", -1), ("selection.max_candidates", 1)])
def test_bad_selection_settings_name_the_field(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(DEFAULT_CONFIG, {key: value})


# --- typed policy options ---------------------------------------------------------------------

def test_policy_option_typo_fails_at_load_naming_the_field_and_the_fix(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\ntiny = true\n[policy]\nname = "l2rr"\nbatch_size = 8\nlamda_waste = 0.25\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "policy.lamda_waste: not an option of data policy 'l2rr'" in message
    assert "did you mean 'lambda_waste'?" in message


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("eta_q", True, "policy.eta_q: Input should be a valid number; got True"),  # a TOML bool is never a number
    ("q_floor", 1.5, "policy.q_floor: Input should be less than 1"),
    ("estimator", "bogus", "policy.estimator: must be one of"),
    ("batch_size", 0, "policy.batch_size: Input should be greater than 0"),
])
def test_policy_option_values_are_checked_at_load(key, value, expected):
    assert expected in error_of({**TINY, "policy": {"name": "l2rr", key: value}})


def test_a_leftover_policy_options_table_says_to_move_its_keys_up():
    message = error_of({**TINY, "policy": {"name": "l2rr", "options": {"lambda_waste": 0.5}}})
    assert "policy.options:" in message and "move every key of [policy.options] up into [policy]" in message


def test_options_of_another_policy_are_refused():
    message = error_of({**TINY, "policy": {"name": "uniform", "lambda_waste": 0.5}})
    assert "policy.lambda_waste: not an option of data policy 'uniform'" in message


def test_resolved_config_holds_every_l2rr_default(tmp_path):
    config = parse_config({**TINY, "policy": {"name": "l2rr", "lambda_waste": 0.5}})
    assert isinstance(config.policy, L2rrOptions)
    saved = json.loads(config.save_resolved(tmp_path).read_text())["policy"]
    assert set(saved) == set(L2rrOptions.model_fields)
    defaults = L2rrOptions().model_dump(mode="json")
    assert saved == {**defaults, "lambda_waste": 0.5}
    assert parse_config({**TINY, "policy": saved}).policy == config.policy  # reloads to the same


def test_an_overridden_policy_name_picks_its_own_options_model():
    config = parse_config(TINY, {"policy.name": "greso"})
    assert config.policy.name == "greso" and config.policy.keep_floor == 0.01


@pytest.mark.parametrize("name", base.policy_names())
def test_every_registered_policy_documents_every_option(name):
    model = base.policy_options_model(name)
    assert issubclass(model, PolicyOptions)
    assert undocumented_fields(model) == []
    assert model().name == name  # constructible with defaults, named after its entry


def test_a_plugin_policy_from_an_entry_point_is_validated_at_load(monkeypatch):
    class PluginOptions(PolicyOptions):
        name: Literal["plug"] = Field(default="plug", description="A third-party policy.")
        alpha: float = Field(default=0.5, ge=0, description="Its one option.")

    class PluginPolicy(base.DataPolicy):
        Options = PluginOptions

        def next_requests(self, step, so_far):
            return []

    class Point:
        name, value = "plug", "thirdparty.policy:PluginPolicy"

        def load(self):
            return PluginPolicy

    # A fresh copy looks the entry points up again, as a new process would.
    monkeypatch.setattr(base, "POLICIES", base.POLICIES.copy())
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [Point()] if group == "target_feedback.policies" else [])
    assert parse_config({**TINY, "policy": {"name": "plug", "alpha": 2.0}}).policy.alpha == 2.0
    assert "policy.alpah: not an option of data policy 'plug'; did you mean 'alpha'?" in error_of(
        {**TINY, "policy": {"name": "plug", "alpah": 2.0}})


# --- typed engine options and tiny-policy spec -----------------------------------------------

def test_engine_options_are_typed_by_the_engine():
    config = parse_config({**TINY, "rollout": {"options": {"batch_size": 4}}})
    assert config.rollout.options.batch_size == 4 and config.rollout.options.num_threads is None
    assert config.rollout.engine_kwargs() == {"batch_size": 4, "num_threads": None}
    assert config.to_json()["rollout"]["options"] == {"batch_size": 4, "num_threads": None}  # defaults saved
    message = error_of({**TINY, "rollout": {"options": {"batch_sise": 4}}})
    assert "rollout.options.batch_sise: not an option of engine 'transformers'; did you mean 'batch_size'?" in message
    assert "rollout.options.num_threads: Input should be greater than or equal to 1" in error_of(
        {**TINY, "rollout": {"options": {"num_threads": 0}}})
    assert "rollout.engine: unknown engine 'vlm'" in error_of({**TINY, "rollout": {"engine": "vlm"}})


def test_tiny_spec_is_typed_and_saved():
    config = parse_config({"model": {"tiny": True, "tiny_spec": {"sft_steps": 5, "sft_lr": 1}}})
    assert config.model.tiny_spec.sft_steps == 5 and config.model.tiny_spec.sft_lr == 1.0
    assert config.to_json()["model"]["tiny_spec"]["hidden_size"] == 128  # every default saved
    assert "model.tiny_spec.hiden_size: unknown setting" in error_of({"model": {"tiny": True, "tiny_spec": {"hiden_size": 64}}})
    assert "model.tiny_spec.num_heads: hidden_size (128) must split" in error_of(
        {"model": {"tiny": True, "tiny_spec": {"num_heads": 3}}})
    assert "model.tiny_spec.seed: Input should be a valid integer; got True" in error_of(
        {"model": {"tiny": True, "tiny_spec": {"seed": True}}})
    assert "tiny_spec is only used with tiny = true" in error_of({"model": {"path": "m", "tiny_spec": {}}})


# --- one config edge --------------------------------------------------------------------------

def test_feedback_paths_resolve_against_the_config_file_folder(tmp_path, monkeypatch):
    folder = tmp_path / "runs" / "cfg"
    folder.mkdir(parents=True)
    (folder / "run.toml").write_text(
        '[model]\npath = "model"\n[feedback]\ntarget = "owner:50051"\nca_cert = "tls/owner-ca.pem"\n'
        f'client_cert = "tls/client.pem"\nclient_key = "{tmp_path / "abs.key"}"\n'
    )
    monkeypatch.chdir(tmp_path)  # the working directory is not where the config lives
    config = load_config(Path("runs/cfg/run.toml"))
    assert config.feedback.ca_cert == folder / "tls" / "owner-ca.pem"
    assert config.feedback.client_cert == folder / "tls" / "client.pem"
    assert config.feedback.client_key == tmp_path / "abs.key"  # absolute paths stay
    assert config.model.path == folder / "model"
    assert config.run.out_dir == Path("runs/train")  # outputs stay relative to the working directory
    from_dict = parse_config({"model": {"path": "model"}})
    assert from_dict.model.path == Path("model")  # no file, no folder: as given


def test_every_field_is_documented_one_way():
    assert undocumented_fields(TrainConfig) == []


def test_grpo_section_is_the_grpo_core_settings_and_the_core_never_reads_the_toml_schema():
    assert TrainConfig.model_fields["grpo"].annotation is GRPOSettings
    assert isinstance(parse_config({**TINY, "grpo": {"lr": 0.01}}).grpo, GRPOSettings)
    source = (Path(__file__).parents[2] / "trainer_node" / "grpo" / "settings.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert "trainer_node.config" not in imported
    with pytest.raises(ValueError, match="seed"):
        GRPOSettings(seed=1)  # run and rollout settings are not GRPO's: one definition each
