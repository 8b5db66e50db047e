"""Checkpoint validation, safe loading and deterministic saving (rlvr_core/models/loading.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from protocol.validation import ALLOWED_ARCHITECTURES
from rlvr_core.models import (
    UnsafeCheckpointError,
    check_model_dir,
    load_policy,
    random_tiny_policy,
    save_policy,
)

TEXTS = [f"Calculate {a} + {b}.\nAnswer: {a + b}" for a in range(12) for b in range(12)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_tiny_policy(tmp_path_factory.mktemp("tiny") / "model", TEXTS, seed=7)


@pytest.fixture()
def copy_dir(model_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(model_dir, target)
    return target


def _edit_json(path: Path, **fields) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def _digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def test_valid_dir_passes_and_returns_config(model_dir: Path) -> None:
    config = check_model_dir(model_dir)
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    ]


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pkl", "optimizer.pt", "training_args.bin", "evil.py"])
def test_refuses_non_allowlisted_files(copy_dir: Path, name: str) -> None:
    (copy_dir / name).write_bytes(b"\x80\x04K\x01.")  # a pickle stream
    with pytest.raises(UnsafeCheckpointError, match=name.replace(".", r"\.")):
        check_model_dir(copy_dir)
    with pytest.raises(UnsafeCheckpointError):
        load_policy(copy_dir)  # the gate runs before any weights are read


def test_refuses_missing_safetensors(copy_dir: Path) -> None:
    (copy_dir / "model.safetensors").unlink()
    with pytest.raises(UnsafeCheckpointError, match="no safetensors"):
        check_model_dir(copy_dir)


def test_refuses_missing_config(copy_dir: Path) -> None:
    (copy_dir / "config.json").unlink()
    with pytest.raises(UnsafeCheckpointError, match="config.json"):
        check_model_dir(copy_dir)


def test_refuses_unknown_architecture(copy_dir: Path) -> None:
    _edit_json(copy_dir / "config.json", architectures=["EvilForCausalLM"])
    with pytest.raises(UnsafeCheckpointError, match="'architectures'.*EvilForCausalLM"):
        check_model_dir(copy_dir)


def test_refuses_model_type_that_disagrees_with_architecture(copy_dir: Path) -> None:
    _edit_json(copy_dir / "config.json", model_type="bert")
    with pytest.raises(UnsafeCheckpointError, match="'model_type'"):
        check_model_dir(copy_dir)


@pytest.mark.parametrize("file_name", ["config.json", "tokenizer_config.json"])
def test_refuses_auto_map(copy_dir: Path, file_name: str) -> None:
    _edit_json(copy_dir / file_name, auto_map={"AutoModelForCausalLM": "evil.EvilModel"})
    with pytest.raises(UnsafeCheckpointError, match=f"{file_name}.*auto_map"):
        check_model_dir(copy_dir)


def test_refuses_invalid_json_config(copy_dir: Path) -> None:
    (copy_dir / "config.json").write_text("{not json")
    with pytest.raises(UnsafeCheckpointError, match="config.json"):
        check_model_dir(copy_dir)


def test_refuses_symlinks_and_subdirectories(copy_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (copy_dir / "generation_config.json").unlink()
    (copy_dir / "generation_config.json").symlink_to(outside)
    with pytest.raises(UnsafeCheckpointError, match="symlink"):
        check_model_dir(copy_dir)
    (copy_dir / "generation_config.json").unlink()
    (copy_dir / "subdir").mkdir()
    with pytest.raises(UnsafeCheckpointError, match="subdir"):
        check_model_dir(copy_dir)


def test_refuses_shard_index_naming_missing_or_bad_shard(copy_dir: Path) -> None:
    (copy_dir / "model.safetensors").rename(copy_dir / "model-00001-of-00002.safetensors")
    index = copy_dir / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(UnsafeCheckpointError, match="missing shard"):
        check_model_dir(copy_dir)
    index.write_text(json.dumps({"weight_map": {"w": "../pytorch_model.bin"}}))
    with pytest.raises(UnsafeCheckpointError, match="disallowed shard"):
        check_model_dir(copy_dir)


def test_refuses_a_path_that_is_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UnsafeCheckpointError, match="not a directory"):
        check_model_dir(tmp_path / "missing")


def test_load_never_uses_torch_load(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("torch.load must never be called")

    monkeypatch.setattr(torch, "load", forbidden)
    model, tokenizer = load_policy(model_dir)
    assert not model.training
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id


def test_save_load_roundtrip_is_exact_and_deterministic(model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load_policy(model_dir)
    first = save_policy(model, tokenizer, tmp_path / "a")
    second = save_policy(model, tokenizer, tmp_path / "b")
    assert _digests(first) == _digests(second) == _digests(model_dir)
    reloaded, _ = load_policy(first)
    ids = torch.tensor([tokenizer("Calculate 3 + 4.\nAnswer:")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, reloaded(input_ids=ids).logits)


def test_save_removes_files_outside_the_allowlist(model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load_policy(model_dir)
    tokenizer.chat_template = "{{ messages }}"  # makes transformers write a chat template file
    out = save_policy(model, tokenizer, tmp_path / "out")
    check_model_dir(out)
    assert not any("chat_template" in p.name for p in out.iterdir())


def test_save_refuses_non_empty_dir_unless_overwrite(model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load_policy(model_dir)
    out = save_policy(model, tokenizer, tmp_path / "out")
    with pytest.raises(FileExistsError, match="not empty"):
        save_policy(model, tokenizer, out)
    assert save_policy(model, tokenizer, out, overwrite=True) == out
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="notes.txt"):
        save_policy(model, tokenizer, out, overwrite=True)
    assert (out / "notes.txt").exists()


# --- the loader runs the owner's upload rule ------------------------------------------------


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda d: _add_token(d / "tokenizer.json", 10_000), "added_tokens.* has id 10000"),
        (lambda d: _edit_json(d / "config.json", quantization_config={"quant_method": "gptq"}), "quantization"),
        (lambda d: _edit_json(d / "config.json", attn_implementation="flash_attention_2"), "attn_impl"),
        (lambda d: _edit_json(d / "config.json", evil_switch=True), "key 'evil_switch' is not allowed"),
        (lambda d: _edit_json(d / "tokenizer_config.json", chat_template="{{ x }}"), "chat_template"),
        (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json is missing"),
    ],
)
def test_check_model_dir_runs_the_upload_rule(copy_dir: Path, damage, match: str) -> None:
    """One rule for upload and load: nothing can pass upload and then fail to load after a charge."""
    from protocol import errors
    from protocol.validation import CheckpointValidationError, validate_checkpoint_dir

    damage(copy_dir)
    with pytest.raises(UnsafeCheckpointError, match=match) as caught:
        check_model_dir(copy_dir)
    assert caught.value.reason == errors.INVALID_CHECKPOINT
    with pytest.raises(CheckpointValidationError, match=match):
        validate_checkpoint_dir(copy_dir)


def _add_token(path: Path, token_id: int) -> None:
    data = json.loads(path.read_text())
    data["added_tokens"].append({"id": token_id, "content": "GUESS", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": False})
    path.write_text(json.dumps(data))


_DECODER_SHAPE = {
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "max_position_embeddings": 64,
}
_TINY_SHAPES = {
    "gpt2": {"n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 64},
    "other": _DECODER_SHAPE,
    "qwen3": {**_DECODER_SHAPE, "head_dim": 8},  # its default is 128
}


@pytest.mark.parametrize("architecture", ALLOWED_ARCHITECTURES)
def test_every_allowed_architecture_saves_checks_and_loads(architecture: str, tmp_path: Path) -> None:
    """What save_policy writes for each allowed architecture passes the upload rule and loads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from protocol.validation import MODEL_TYPE_OF_ARCHITECTURE, validate_checkpoint_dir
    from rlvr_core.models.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    model_type = MODEL_TYPE_OF_ARCHITECTURE[architecture]
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        **_TINY_SHAPES.get(model_type, _TINY_SHAPES["other"]),
    )
    config.architectures = [architecture]
    torch.manual_seed(0)
    out = save_policy(AutoModelForCausalLM.from_config(config), tokenizer, tmp_path / model_type)
    checked = validate_checkpoint_dir(out)
    assert checked.embedding.rows == len(tokenizer)
    model, loaded = load_policy(out)
    assert type(model).__name__ == architecture
    ids = torch.tensor([loaded("Calculate 3 + 4.\nAnswer:")["input_ids"]])
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape[-1] == checked.embedding.rows


def test_the_refused_tokenizer_would_fail_exactly_the_prompts_with_the_guessed_string(copy_dir: Path) -> None:
    """Why ids are checked against the embedding (issue 11, hole 1): loaded past the check, a
    token one past the last row makes generation fail on exactly the prompts that contain it,
    so an evaluation's error status would reveal whether a sampled row holds the string."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    rows = json.loads((copy_dir / "config.json").read_text())["vocab_size"]
    _add_token(copy_dir / "tokenizer.json", rows)
    with pytest.raises(UnsafeCheckpointError, match=f"has id {rows}, but the input embedding"):
        check_model_dir(copy_dir)
    model = AutoModelForCausalLM.from_pretrained(str(copy_dir), use_safetensors=True, local_files_only=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(copy_dir), local_files_only=True)

    def forward(prompt: str) -> torch.Tensor:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            return model(input_ids=ids).logits

    forward("Calculate 3 + 4.\nAnswer:")  # no guessed string: fine
    with pytest.raises(IndexError):
        forward("Calculate 3 + GUESS.\nAnswer:")
