"""safetensors header parsing and whole checkpoint directories (file layout, weights vs. config).

config.json and tokenizer rules have their own files: test_validation_config.py and
test_validation_tokenizer.py.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from protocol import errors
from protocol.conformance.checkpoints import safetensors_bytes, tiny_checkpoint_files, write_checkpoint
from protocol.validation import (
    CheckpointValidationError,
    validate_checkpoint_dir,
    validate_safetensors,
    verify_sha256,
)


def _tiny_tensors() -> dict[str, torch.Tensor]:
    return {
        "embed.weight": torch.zeros(4, 3, dtype=torch.float32),
        "norm.weight": torch.ones(3, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 5, dtype=torch.float16),
    }


def _raw_safetensors(path: Path, header: object, data: bytes, header_length: int | None = None) -> Path:
    encoded = json.dumps(header).encode() if not isinstance(header, bytes) else header
    length = len(encoded) if header_length is None else header_length
    path.write_bytes(struct.pack("<Q", length) + encoded + data)
    return path


def _refused(path: Path, match: str) -> CheckpointValidationError:
    with pytest.raises(CheckpointValidationError, match=match) as caught:
        validate_safetensors(path)
    assert caught.value.reason == errors.INVALID_CHECKPOINT
    return caught.value


def test_a_real_tiny_safetensors_file_passes(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_tiny_tensors(), str(path), metadata={"format": "pt"})
    summary = validate_safetensors(path)
    assert summary.tensor_count == 3
    assert summary.data_bytes == 4 * 3 * 4 + 3 * 2
    assert summary.dtypes == {"F32", "BF16", "F16"}
    assert summary.metadata == {"format": "pt"}


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_tiny_tensors(), str(path))
    whole = path.read_bytes()
    path.write_bytes(whole[:-5])
    _refused(path, "truncated")
    path.write_bytes(whole[:5])
    _refused(path, "truncated")
    path.write_bytes(whole[:20])  # header cut in the middle
    _refused(path, "truncated")


def test_trailing_bytes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_tiny_tensors(), str(path))
    path.write_bytes(path.read_bytes() + b"\x00" * 4)
    _refused(path, "data section")


def test_oversized_header_length_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = _raw_safetensors(tmp_path / "model.safetensors", {}, b"", header_length=1 << 40)
    _refused(path, "exceeds")
    small = _raw_safetensors(
        tmp_path / "small.safetensors", {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"x"
    )
    with pytest.raises(CheckpointValidationError, match="exceeds"):
        validate_safetensors(small, max_header_bytes=10)


def test_overlapping_offsets_are_refused(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    _refused(_raw_safetensors(tmp_path / "m.safetensors", header, b"\x00" * 12), "overlaps")


def test_gaps_and_out_of_range_offsets_are_refused(tmp_path: Path) -> None:
    gap = {"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}
    _refused(_raw_safetensors(tmp_path / "gap.safetensors", gap, b"\x00" * 4), "gap")
    beyond = {"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}
    _refused(_raw_safetensors(tmp_path / "beyond.safetensors", beyond, b"\x00" * 4), "data section")


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}, "unknown dtype"),
        ({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}, "byte size"),
        ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "shape"),
        ({"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}, "shape"),
        ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}, "shape"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "end before begin"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0]}, "data_offsets"),
        ({"dtype": "F32", "shape": [1]}, "exactly the keys"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "code": "x"}, "exactly the keys"),
        ("not an object", "not a JSON object"),
    ],
)
def test_bad_tensor_entries_are_refused(tmp_path: Path, entry: object, match: str) -> None:
    path = _raw_safetensors(tmp_path / "m.safetensors", {"weight": entry}, b"\x00" * 4)
    error = _refused(path, match)
    assert "'weight'" in error.message  # names the key


def test_sub_byte_dtypes_must_fill_whole_bytes(tmp_path: Path) -> None:
    ok = {"a": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}
    assert (
        validate_safetensors(
            _raw_safetensors(tmp_path / "ok.safetensors", ok, b"\x00" * 2), cross_check=False
        ).data_bytes
        == 2
    )
    odd = {"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}
    _refused(_raw_safetensors(tmp_path / "odd.safetensors", odd, b"\x00" * 2), "byte size")


@pytest.mark.parametrize(
    "header, match",
    [
        (b"[1, 2, 3]", "not a JSON object"),
        (b"{not json", "UTF-8 JSON"),
        (b'{"a": 1, "a": 2}', "duplicate JSON key"),
        (b"\xff\xfe{}", "UTF-8 JSON"),
        (json.dumps({"__metadata__": {"k": 1}}).encode(), "__metadata__"),
    ],
)
def test_bad_headers_are_refused(tmp_path: Path, header: bytes, match: str) -> None:
    _refused(_raw_safetensors(tmp_path / "m.safetensors", header, b""), match)


def test_header_padding_and_metadata_are_accepted(tmp_path: Path) -> None:
    header = json.dumps(
        {"__metadata__": {"format": "pt"}, "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}
    )
    path = _raw_safetensors(tmp_path / "m.safetensors", (header + "   ").encode(), b"\x01\x02")
    assert validate_safetensors(path).tensor_count == 1


def test_messages_do_not_echo_file_contents(tmp_path: Path) -> None:
    secret = "SECRET-CONTENT-1234"
    header = {"__metadata__": {"note": secret}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}
    error = _refused(_raw_safetensors(tmp_path / "m.safetensors", header, b"\x00" * 8), "byte size")
    assert secret not in str(error)


# --- whole directories ------------------------------------------------------------------


def _checkpoint(directory: Path) -> Path:
    """The conformance suite's valid tiny Qwen2 checkpoint (numpy + tokenizers only: fast)."""
    return write_checkpoint(tiny_checkpoint_files(seed=0), directory)


def _edit_json(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _refused_dir(directory: Path, match: str, reason: str = errors.INVALID_CHECKPOINT) -> str:
    with pytest.raises(CheckpointValidationError, match=match) as caught:
        validate_checkpoint_dir(directory)
    assert caught.value.reason == reason
    return caught.value.message


def test_valid_checkpoint_dir(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path / "ckpt")
    result = validate_checkpoint_dir(directory)
    assert result.config == json.loads((directory / "config.json").read_text())
    assert result.files == (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    )
    assert result.total_bytes == sum(p.stat().st_size for p in directory.iterdir())
    assert (result.embedding.tensor, result.embedding.rows) == ("model.embed_tokens.weight", 300)
    assert result.tokenizer.eos_token_id == 0


@pytest.mark.parametrize(
    "damage, reason, match",
    [
        (lambda d: (d / "pytorch_model.bin").write_bytes(b"x"), errors.DISALLOWED_FILE, "pickle"),
        (lambda d: (d / "config.json").unlink(), errors.INVALID_CHECKPOINT, "config.json is missing"),
        (lambda d: (d / "tokenizer.json").unlink(), errors.INVALID_CHECKPOINT, "tokenizer.json is missing"),
        (lambda d: (d / "model.safetensors").unlink(), errors.INVALID_CHECKPOINT, "no safetensors"),
        (
            lambda d: _edit_json(d / "tokenizer_config.json", auto_map={}),
            errors.INVALID_CHECKPOINT,
            "auto_map",
        ),
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 4),
            errors.INVALID_CHECKPOINT,
            "truncated",
        ),
        (lambda d: (d / "special_tokens_map.json").mkdir(), errors.DISALLOWED_FILE, "regular file"),
        (
            lambda d: (d / "special_tokens_map.json").symlink_to("/etc/hostname"),
            errors.DISALLOWED_FILE,
            "symlink",
        ),
        (
            lambda d: (d / "model-00001-of-00002.safetensors").write_bytes(
                (d / "model.safetensors").read_bytes()
            ),
            errors.INVALID_CHECKPOINT,
            "must be the only weights file",
        ),
    ],
)
def test_damaged_checkpoint_dirs_are_refused(tmp_path: Path, damage, reason: str, match: str) -> None:
    directory = _checkpoint(tmp_path / "ckpt")
    damage(directory)
    _refused_dir(directory, match, reason)


def _shard(directory: Path) -> dict[str, str]:
    """Split model.safetensors into two shards plus an index, as save_pretrained would."""
    from safetensors.numpy import load_file

    tensors = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, members in halves.items():
        (directory / shard).write_bytes(safetensors_bytes({name: tensors[name] for name in members}))
        weight_map.update(dict.fromkeys(members, shard))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return weight_map


def test_sharded_checkpoint_with_index(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path / "ckpt")
    weight_map = _shard(directory)
    result = validate_checkpoint_dir(directory)
    assert "model.safetensors.index.json" in result.files and result.embedding.rows == 300
    index = directory / "model.safetensors.index.json"
    extra = {"extra.weight": "model-00003-of-00003.safetensors"}
    index.write_text(json.dumps({"weight_map": {**weight_map, **extra}}))
    _refused_dir(directory, "missing shard")
    index.write_text(json.dumps({"weight_map": {**weight_map, "model.norm.weight": "../pytorch_model.bin"}}))
    _refused_dir(directory, "disallowed shard")


def test_index_must_match_the_shard_headers(tmp_path: Path) -> None:
    """The embedding is read from the shard the loader reads it from; a stale index is refused."""
    directory = _checkpoint(tmp_path / "ckpt")
    weight_map = _shard(directory)
    index = directory / "model.safetensors.index.json"
    moved = dict(weight_map)
    tensor = "model.embed_tokens.weight"
    moved[tensor] = next(s for s in set(weight_map.values()) if s != weight_map[tensor])
    index.write_text(json.dumps({"weight_map": moved}))
    _refused_dir(directory, "does not hold it")
    index.write_text(json.dumps({"weight_map": {k: v for k, v in weight_map.items() if k != tensor}}))
    _refused_dir(directory, "leaves out tensor 'model.embed_tokens.weight'")
    (directory / "model.safetensors.index.json").unlink()
    _refused_dir(directory, "need model.safetensors.index.json")


def test_total_size_limit(tmp_path: Path) -> None:
    with pytest.raises(CheckpointValidationError, match="over the") as caught:
        validate_checkpoint_dir(_checkpoint(tmp_path / "ckpt"), max_total_bytes=10)
    assert caught.value.reason == errors.UPLOAD_TOO_LARGE


def test_checksum(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "config.json"
    path.write_bytes(b"{}")
    verify_sha256(path, hashlib.sha256(b"{}").hexdigest().upper())
    with pytest.raises(CheckpointValidationError, match="sha256") as caught:
        verify_sha256(path, "0" * 64)
    assert caught.value.reason == errors.CHECKSUM_MISMATCH


# --- the weights against config.json ------------------------------------------------------------


def _replace_tensor(directory: Path, name: str, array) -> None:
    from safetensors.numpy import load_file

    tensors = load_file(str(directory / "model.safetensors"))
    if array is None:
        del tensors[name]
    else:
        tensors[name] = array
    (directory / "model.safetensors").write_bytes(safetensors_bytes(tensors))


def test_vocab_size_must_equal_the_embedding_rows(tmp_path: Path) -> None:
    """transformers refuses to load weights whose shape disagrees with config.json."""
    directory = _checkpoint(tmp_path / "ckpt")
    for vocab_size in (299, 301):
        _edit_json(directory / "config.json", vocab_size=vocab_size)
        _refused_dir(directory, f"'vocab_size' is {vocab_size} but the input embedding .* has 300 rows")
    _edit_json(directory / "config.json", vocab_size=300, hidden_size=64)
    _refused_dir(directory, "'hidden_size' is 64 but the input embedding .* is 32 wide")


def test_output_head_must_match_the_embedding(tmp_path: Path) -> None:
    import numpy as np

    directory = _checkpoint(tmp_path / "ckpt")
    _replace_tensor(directory, "lm_head.weight", np.zeros((300, 32), np.float32))
    validate_checkpoint_dir(directory)  # an untied head of the same shape is fine
    _replace_tensor(directory, "lm_head.weight", np.zeros((310, 32), np.float32))
    _refused_dir(directory, "output head 'lm_head.weight' has shape \\[310, 32\\]")


def test_the_embedding_must_be_in_the_weights(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path / "ckpt")
    _replace_tensor(directory, "model.embed_tokens.weight", None)
    _refused_dir(directory, "no input embedding 'model.embed_tokens.weight'")


@pytest.mark.parametrize("file_name", ["config.json", "generation_config.json"])
def test_token_ids_of_configs_must_be_embedding_rows(tmp_path: Path, file_name: str) -> None:
    """A pad or eos id is fed back into the model once a row finishes: it must be embeddable."""
    directory = _checkpoint(tmp_path / "ckpt")
    _edit_json(directory / file_name, pad_token_id=300)
    _refused_dir(directory, f"{file_name}: 'pad_token_id' is 300, but the input embedding")
    _edit_json(directory / file_name, pad_token_id=0, eos_token_id=[0, 1000])
    _refused_dir(directory, f"{file_name}: 'eos_token_id' is 1000")
