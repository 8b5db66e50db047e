"""Checkpoint validation, safe loading and deterministic saving (rlvr_core/models/loading.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

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
    index = copy_dir / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors"}}))
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
