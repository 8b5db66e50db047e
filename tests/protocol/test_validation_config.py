"""config.json: allowlisted architectures, the matching model_type, only known keys and values.

The key lists in protocol/config_rules.py are static data; the sync tests at the bottom check
that they still cover what the installed transformers writes for every allowed architecture.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from protocol import errors
from protocol.config_rules import (
    ALLOWED_ARCHITECTURES,
    MODEL_TYPE_OF_ARCHITECTURE,
    REFUSED_CONFIG_KEYS,
    RESTRICTED_CONFIG_VALUES,
    allowed_config_keys,
)
from protocol.conformance.checkpoints import tiny_checkpoint_files
from protocol.validation import CheckpointValidationError, validate_config_json


@pytest.fixture()
def config() -> dict:
    return json.loads(next(f.data for f in tiny_checkpoint_files(seed=0) if f.name == "config.json"))


def _refused(config: dict, match: str) -> str:
    with pytest.raises(CheckpointValidationError, match=match) as caught:
        validate_config_json(json.dumps(config).encode())
    assert caught.value.reason == errors.INVALID_CHECKPOINT
    return caught.value.message


def test_a_valid_config_is_returned(config) -> None:
    assert validate_config_json(json.dumps(config).encode()) == config


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"architectures": ["EvilForCausalLM"]}, "'architectures' entry 'EvilForCausalLM' is not allowed"),
        ({"architectures": ["Qwen2ForCausalLM", "EvilForCausalLM"]}, "not allowed"),
        ({"architectures": []}, "non-empty list"),
        ({"architectures": "Qwen2ForCausalLM"}, "non-empty list"),
        ({"architectures": [3]}, "entry a int is not allowed"),
        ({"model_type": None}, "'model_type' must be a non-empty string"),
    ],
)
def test_bad_architectures_are_refused(config, changes, match) -> None:
    _refused({**config, **changes}, match)


@pytest.mark.parametrize("model_type", ["llama", "bert", "qwen2_moe"])
def test_model_type_must_match_the_architecture(config, model_type) -> None:
    """AutoModelForCausalLM picks the class from model_type: both must name the same one."""
    _refused(
        {**config, "model_type": model_type},
        f"'model_type' is '{model_type}' but architecture Qwen2ForCausalLM needs 'qwen2'",
    )


def test_auto_map_is_refused_at_any_depth(config) -> None:
    _refused(
        {**config, "auto_map": {"AutoModelForCausalLM": "evil.Model"}},
        "'auto_map' is not allowed: .*remote code",
    )
    nested = {**config, "task_specific_params": {"text-generation": {"auto_map": {"AutoConfig": "x.Y"}}}}
    _refused(nested, "'task_specific_params.text-generation.auto_map' is not allowed")


def test_quantization_config_is_refused(config) -> None:
    quantized = {**config, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    message = _refused(quantized, "'quantization_config' is not allowed")
    assert "quantizer backend" in message
    _refused(
        {**config, "rope_parameters": {"quantization_config": {}}}, "'rope_parameters.quantization_config'"
    )


def test_unknown_keys_are_refused(config) -> None:
    _refused(
        {**config, "use_flash_kernels_from": "hub/repo"},
        "key 'use_flash_kernels_from' is not allowed for model_type 'qwen2'",
    )
    # A key of another model type's config is unknown here too.
    _refused({**config, "mlp_bias": False}, "key 'mlp_bias' is not allowed for model_type 'qwen2'")


@pytest.mark.parametrize(
    "key, value",
    [
        ("attn_implementation", "flash_attention_2"),
        ("attn_implementation", "kernels-community/flash-attn"),
        ("_attn_implementation", "flex_attention"),
        ("return_dict", False),
        ("torchscript", True),
        ("output_attentions", True),
        ("output_hidden_states", True),
        ("add_cross_attention", True),
        ("is_encoder_decoder", True),
        ("pruned_heads", {"0": [1]}),
        ("tokenizer_class", "EvilTokenizer"),
        ("return_dict", 1),  # JSON 1 is not true
    ],
)
def test_restricted_values_are_refused(config, key, value) -> None:
    message = _refused({**config, key: value}, f"'{key}' must be")
    assert RESTRICTED_CONFIG_VALUES[key][1] in message


@pytest.mark.parametrize(
    "key, value",
    [
        ("attn_implementation", "sdpa"),
        ("attn_implementation", "eager"),
        ("_attn_implementation", None),
        ("return_dict", True),
    ],
)
def test_restricted_keys_with_vetted_values_pass(config, key, value) -> None:
    validate_config_json(json.dumps({**config, key: value}).encode())


@pytest.mark.parametrize(
    "changes, match",
    [
        (
            {"rope_parameters": {"rope_type": "evil", "rope_theta": 1.0}},
            "'rope_parameters.rope_type' must be",
        ),
        ({"rope_scaling": {"type": "custom"}}, "'rope_scaling.type' must be"),
        ({"rope_scaling": "linear"}, "'rope_scaling' must be an object"),
        ({"layer_types": ["full_attention", "moe"]}, "'layer_types' must list only"),
        ({"vocab_size": "300"}, "'vocab_size' must be a positive integer"),
        ({"hidden_size": 0}, "'hidden_size' must be a positive integer"),
    ],
)
def test_bad_values_are_refused(config, changes, match) -> None:
    _refused({**config, **changes}, match)


def test_the_architecture_allowlist_can_be_narrowed_not_widened(config) -> None:
    with pytest.raises(CheckpointValidationError, match="not allowed"):
        validate_config_json(json.dumps(config).encode(), allowed_architectures=("LlamaForCausalLM",))
    evil = {**config, "architectures": ["EvilForCausalLM"], "model_type": "evil"}
    with pytest.raises(CheckpointValidationError, match="not allowed"):
        validate_config_json(json.dumps(evil).encode(), allowed_architectures=("EvilForCausalLM",))


def test_every_allowed_architecture_has_an_embedding_name() -> None:
    from protocol.validation import EMBEDDING_OF_ARCHITECTURE

    assert set(EMBEDDING_OF_ARCHITECTURE) == set(ALLOWED_ARCHITECTURES)


@pytest.mark.parametrize("data", [b"", b"[]", b"{", b'"text"', b"[" * 100_000])
def test_config_must_be_a_json_object(data: bytes) -> None:
    with pytest.raises(CheckpointValidationError, match="config.json") as caught:
        validate_config_json(data)
    assert caught.value.reason == errors.INVALID_CHECKPOINT


def test_every_refused_key_says_why() -> None:
    assert set(REFUSED_CONFIG_KEYS) == {"auto_map", "quantization_config"}
    assert all(len(why) > 20 for why in REFUSED_CONFIG_KEYS.values())
    assert all(len(why) > 10 for _, why in RESTRICTED_CONFIG_VALUES.values())


def test_protocol_validation_stays_light_to_import() -> None:
    """The owner's upload path must not import transformers or torch (startup time, attack surface)."""
    code = (
        "import sys, protocol.validation; "
        "heavy = [m for m in ('transformers', 'torch', 'tokenizers') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- in sync with the installed transformers -------------------------------------------------

_TINY = {
    "qwen2": {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32,
    },
    "gpt2": {"n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 32},
}


def _tiny_config(model_type: str, vocab_size: int = 64):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab_size, **_TINY.get(model_type, _TINY["qwen2"]))


def test_model_type_map_matches_transformers() -> None:
    import transformers

    assert set(MODEL_TYPE_OF_ARCHITECTURE) == set(ALLOWED_ARCHITECTURES)
    for architecture, model_type in MODEL_TYPE_OF_ARCHITECTURE.items():
        assert getattr(transformers, architecture).config_class.model_type == model_type


@pytest.mark.parametrize("architecture", ALLOWED_ARCHITECTURES)
def test_key_lists_cover_what_transformers_writes(architecture, tmp_path) -> None:
    """The static key lists must cover every key the installed transformers' config class has,
    and every key save_pretrained writes; the written config must pass as a whole."""
    model_type = MODEL_TYPE_OF_ARCHITECTURE[architecture]
    config = _tiny_config(model_type)
    missing = set(config.to_dict()) - allowed_config_keys(model_type)
    assert not missing, f"add to protocol/config_rules.py for {model_type}: {sorted(missing)}"
    config.architectures = [architecture]
    config.save_pretrained(str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())
    assert not set(written) - allowed_config_keys(model_type)
    assert validate_config_json((tmp_path / "config.json").read_bytes()) == written


def test_the_rlvr_loader_uses_this_map() -> None:
    from rlvr_core.models import loading

    assert loading.MODEL_TYPE_OF_ARCHITECTURE is MODEL_TYPE_OF_ARCHITECTURE
