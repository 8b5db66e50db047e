"""The one config edge both nodes use: errors name the field and the fix, TOML loading, paths."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pytest
from pydantic import Field, ValidationError, field_validator

import target_owner_node.config as owner_config
import trainer_node.config as trainer_config
from rlvr_core.configuration import (
    ConfigError,
    ConfigPath,
    OptionsSection,
    Section,
    default_of,
    field_error,
    load_toml,
    undocumented_fields,
    validate,
    validate_options,
)


class Inner(Section):
    size: int = Field(default=1, gt=0, description="A positive size.")
    name: str = Field(default="x", description="A name.")

    @field_validator("name")
    @classmethod
    def _not_bad(cls, value: str) -> str:
        if value == "bad":
            raise ValueError("must not be 'bad'; got 'bad'")
        return value


class Outer(Section):
    inner: Inner = Field(default_factory=Inner, description="A nested section.")
    items: list[int] = Field(default_factory=list, description="Some numbers.")
    path: ConfigPath | None = Field(default=None, description="An input path.")
    required: str = Field(description="Must be given.")


def message_of(raw, base_dir=None) -> str:
    with pytest.raises(ConfigError) as caught:
        validate(Outer, raw, source="x.toml", reference="the example", base_dir=base_dir)
    return str(caught.value)


def test_every_kind_of_error_names_the_field_and_the_fix():
    message = message_of({"inner": {"size": 0, "name": "bad", "colour": 1}, "items": [1, "two"]})
    lines = message.splitlines()
    assert lines[0] == "invalid config x.toml:"
    assert "  inner.size: Input should be greater than 0; got 0" in lines  # bounds: the value shown
    assert "  inner.name: must not be 'bad'; got 'bad'" in lines  # our own messages as written
    assert "  inner.colour: unknown setting; remove it or check its spelling and section (see the example)" in lines
    assert "  items[1]: Input should be a valid integer, unable to parse string as an integer; got 'two'" in lines
    assert "  required: required; add it to the config" in lines


def test_config_paths_resolve_against_the_config_folder(tmp_path):
    assert validate(Outer, {"required": "r", "path": "a/b"}, source="s", reference="r", base_dir=tmp_path).path == (
        tmp_path / "a" / "b")
    assert validate(Outer, {"required": "r", "path": "/abs"}, source="s", reference="r", base_dir=tmp_path).path == (
        Path("/abs"))
    assert validate(Outer, {"required": "r", "path": "a"}, source="s", reference="r").path == Path("a")
    home = validate(Outer, {"required": "r", "path": "~/k"}, source="s", reference="r", base_dir=tmp_path).path
    assert home == Path.home() / "k"


def test_load_toml_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config file not found: .*none\.toml \(make one\)"):
        load_toml(tmp_path / "none.toml", missing_hint=" (make one)")
    (tmp_path / "bad.toml").write_text("[a\n")
    with pytest.raises(ConfigError, match="bad.toml is not valid TOML"):
        load_toml(tmp_path / "bad.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_toml(tmp_path)
    (tmp_path / "latin.toml").write_bytes(b'a = "\xe9"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_toml(tmp_path / "latin.toml")
    (tmp_path / "ok.toml").write_text('[a]\nb = 1\n')
    assert load_toml(tmp_path / "ok.toml") == {"a": {"b": 1}}


class PartOptions(OptionsSection):
    alpha: float = Field(default=0.5, ge=0, description="A weight.")
    rounds: int = Field(default=2, ge=1, description="A count.")


def test_validate_options_names_an_unknown_option_with_the_closest_valid_one():
    with pytest.raises(ValidationError) as caught:
        validate_options(PartOptions, {"alhpa": 1.0, "rounds": 0}, part="widget 'w'")
    errors = {item["loc"]: item["msg"] for item in caught.value.errors()}
    assert errors[("alhpa",)] == "not an option of widget 'w'; did you mean 'alpha'? valid options: alpha, rounds"
    assert errors[("rounds",)].startswith("Input should be greater than or equal to 1")
    assert validate_options(PartOptions, {"alpha": 2}, part="w").alpha == 2.0  # ints widen to float
    with pytest.raises(ValidationError, match="valid number"):
        validate_options(PartOptions, {"alpha": True}, part="w")  # options are strict: a bool is not a number


def test_errors_raised_inside_a_validator_nest_under_the_field():
    class Holder(Section):
        part: PartOptions = Field(default_factory=PartOptions, description="A part.")

        @field_validator("part", mode="wrap")
        @classmethod
        def _typed(cls, value, handler):
            if value == "moved":
                raise field_error("Part", ("options",), "moved_table", "move it up", value)
            return validate_options(PartOptions, value, part="the part")

    with pytest.raises(ConfigError) as caught:
        validate(Holder, {"part": {"rouns": 1}}, source="s", reference="r")
    assert "  part.rouns: not an option of the part; did you mean 'rounds'?" in str(caught.value)
    with pytest.raises(ConfigError, match=r"  part\.options: move it up"):
        validate(Holder, {"part": "moved"}, source="s", reference="r")


def test_both_nodes_share_the_edge():
    assert trainer_config.ConfigError is owner_config.ConfigError is ConfigError
    assert issubclass(trainer_config.TrainConfig, Section) and issubclass(owner_config.OwnerConfig, Section)
    for model in (trainer_config.TrainConfig, owner_config.OwnerConfig):
        assert undocumented_fields(model) == []  # documented one way, for a --help/docs generator
    assert default_of(owner_config.PrivacyConfig, "epsilon_budget") == owner_config.PrivacyConfig().epsilon_budget
    assert undocumented_fields(Outer) == [] and "size" in undocumented_fields(
        type("Bare", (Section,), {"__annotations__": {"size": int}, "size": 1}))


def test_engine_options_are_validated_by_build_engine_before_anything_is_built():
    from rlvr_core.engines.registry import ENGINES, build_engine
    from rlvr_core.engines.transformers_engine import TransformersEngineOptions
    from rlvr_core.engines.vllm_engine import VLLMEngineOptions

    assert ENGINES.options_model("transformers") is TransformersEngineOptions
    assert ENGINES.options_model("vllm") is VLLMEngineOptions
    with pytest.raises(ValidationError, match="(?s)batch_sise.*did you mean 'batch_size'"):
        build_engine("transformers", None, None, batch_sise=3)  # no model needed: refused first
    with pytest.raises(ValidationError, match="(?s)trust_remote_code.*set by the engine itself"):
        VLLMEngineOptions(llm_args={"trust_remote_code": True})
    assert undocumented_fields(TransformersEngineOptions) == undocumented_fields(VLLMEngineOptions) == []


def test_tiny_policy_spec_is_typed_and_keeps_its_dataclass_api():
    from rlvr_core.models.tiny_spec import TinyPolicySpec

    spec = replace(TinyPolicySpec(), sft_lr=1)
    assert spec.sft_lr == 1.0 and isinstance(spec.sft_lr, float)  # widened: one cache key for 1 and 1.0
    assert asdict(spec)["hidden_size"] == 128
    with pytest.raises(ValidationError, match="hiden_size"):
        TinyPolicySpec(hiden_size=3)
    assert undocumented_fields(TinyPolicySpec) == []


def test_the_config_edge_imports_neither_torch_nor_a_node_package():
    import subprocess
    import sys

    code = ("import sys, rlvr_core.configuration, rlvr_core.models.tiny_spec, trainer_node.config; "
            "heavy = [m for m in ('torch', 'transformers', 'target_owner_node') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
