"""LoRA adapters beside a checkpoint: accepted when they fit the base, refused (naming the file and
the field) for anything an evaluation could trip on (protocol/adapter_rules.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from protocol import errors
from protocol.conformance.checkpoints import (
    lora_adapter_files,
    tensor_shard_files,
    tiny_checkpoint_files,
    write_checkpoint,
)
from protocol.validation import CheckpointValidationError, is_allowed_file_name, validate_checkpoint_dir

Q = "base_model.model.model.layers.0.self_attn.q_proj"


def check(files, tmp_path, **kwargs):
    return validate_checkpoint_dir(write_checkpoint(files, tmp_path / "ckpt"), **kwargs)


def test_an_adapter_that_fits_the_base_is_accepted_with_its_scale(tmp_path):
    result = check(lora_adapter_files(tiny_checkpoint_files(0), rank=4, alpha=8.0), tmp_path)
    assert result.adapter is not None and result.adapter.rank == 4 and result.adapter.scale == 2.0
    assert {m.module.rsplit(".", 1)[-1] for m in result.adapter.modules} == {"q_proj", "v_proj"}
    assert is_allowed_file_name("adapter_model.safetensors") and is_allowed_file_name("adapter_config.json")
    assert check(tiny_checkpoint_files(0), tmp_path / "plain").adapter is None


def test_per_tensor_shards_of_a_checkpoint_are_a_valid_checkpoint(tmp_path):
    files = tensor_shard_files(tiny_checkpoint_files(0))
    assert sum(f.name.endswith(".safetensors") for f in files) > 10
    check(files, tmp_path)
    check(lora_adapter_files(files), tmp_path / "with-adapter")  # an adapter beside shards too


@pytest.mark.parametrize(("changes", "match"), [
    ({"config_changes": {"use_dora": True}}, "'use_dora' must be false"),
    ({"config_changes": {"modules_to_save": ["lm_head"]}}, "key 'modules_to_save' is not allowed"),
    ({"config_changes": {"auto_map": {"x": "y"}}}, "auto_map|not allowed"),
    ({"config_changes": {"r": 300}}, r"'r' must be an int in \[1, 256\]"),
    ({"config_changes": {"lora_alpha": float("nan")}}, "not valid UTF-8 JSON|'lora_alpha'"),
    ({"config_changes": {"peft_type": "IA3"}}, "'peft_type' must be \"LORA\""),
    ({"config_changes": {"target_modules": ["q_proj"]}}, "not in target_modules"),
    ({"config_changes": {"r": 8}}, "lora_A must be"),
    ({"tensors_changes": {f"{Q}.lora_B.weight": None}}, "needs both lora_A and lora_B"),
    ({"tensors_changes": {f"{Q}.lora_A.weight": np.zeros((4, 7), np.float32)}}, "lora_A must be"),
    ({"tensors_changes": {f"{Q}.lora_A.weight": np.zeros((4, 32), np.int32)}}, "dtype I32 is not allowed"),
    ({"tensors_changes": {"base_model.model.model.embed_tokens.lora_A.weight": np.zeros((4, 32), np.float32),
                          "base_model.model.model.embed_tokens.lora_B.weight": np.zeros((300, 4), np.float32)}},
     "not a linear layer"),
    ({"tensors_changes": {"base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight":
                          np.zeros((4, 32), np.float32)}}, "not a linear layer"),
    ({"tensors_changes": {"lm_head.weight": np.zeros((4, 4), np.float32)}}, "is not a LoRA weight"),
])
def test_a_bad_adapter_is_refused_naming_what_is_wrong(tmp_path, changes, match):
    with pytest.raises(CheckpointValidationError, match=match) as caught:
        check(lora_adapter_files(tiny_checkpoint_files(0), **changes), tmp_path)
    assert caught.value.reason == errors.INVALID_CHECKPOINT


def test_half_an_adapter_and_an_oversized_one_are_refused(tmp_path):
    files = lora_adapter_files(tiny_checkpoint_files(0))
    with pytest.raises(CheckpointValidationError, match="needs both adapter_config.json and adapter_model"):
        check([f for f in files if f.name != "adapter_model.safetensors"], tmp_path / "a")
    with pytest.raises(CheckpointValidationError, match="over this server's adapter limit") as caught:
        check(files, tmp_path / "b", max_adapter_bytes=100)
    assert caught.value.reason == errors.UPLOAD_TOO_LARGE


def test_an_adapter_on_a_conv1d_architecture_is_refused(tmp_path):
    from protocol.adapter_rules import validate_adapter

    files = lora_adapter_files(tiny_checkpoint_files(0))
    folder = write_checkpoint(files, tmp_path / "c")
    config = json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]}).encode()
    with pytest.raises(CheckpointValidationError, match="LoRA adapters are accepted for"):
        validate_adapter(config, folder / "adapter_model.safetensors", "GPT2LMHeadModel", {}, "transformer.wte.weight")
