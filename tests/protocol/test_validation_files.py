"""safetensors header parsing, JSON files and whole checkpoint directories."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from protocol import errors
from protocol.validation import (
    CheckpointValidationError,
    validate_checkpoint_dir,
    validate_config_json,
    validate_safetensors,
    validate_tokenizer_json,
    verify_sha256,
)

CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 8}


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


# --- JSON files -------------------------------------------------------------------------


def test_valid_config_is_returned() -> None:
    assert validate_config_json(json.dumps(CONFIG).encode()) == CONFIG


@pytest.mark.parametrize(
    "config, match",
    [
        ({**CONFIG, "auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}}, "auto_map"),
        ({**CONFIG, "architectures": ["EvilForCausalLM"]}, "'EvilForCausalLM' is not allowed"),
        ({**CONFIG, "architectures": ["Qwen2ForCausalLM", "EvilForCausalLM"]}, "not allowed"),
        ({**CONFIG, "architectures": []}, "non-empty list"),
        ({**CONFIG, "architectures": "Qwen2ForCausalLM"}, "non-empty list"),
        ({**CONFIG, "architectures": [3]}, "non-string"),
        ({k: v for k, v in CONFIG.items() if k != "model_type"}, "model_type"),
    ],
)
def test_bad_configs_are_refused(config: dict, match: str) -> None:
    with pytest.raises(CheckpointValidationError, match=match) as caught:
        validate_config_json(json.dumps(config).encode())
    assert caught.value.reason == errors.INVALID_CHECKPOINT


def test_config_architecture_allowlist_can_be_narrowed() -> None:
    with pytest.raises(CheckpointValidationError, match="not allowed"):
        validate_config_json(json.dumps(CONFIG).encode(), allowed_architectures=("LlamaForCausalLM",))


@pytest.mark.parametrize("data", [b"", b"[]", b"{", b'"text"'])
def test_config_must_be_a_json_object(data: bytes) -> None:
    with pytest.raises(CheckpointValidationError, match="config.json"):
        validate_config_json(data)


def test_tokenizer_files() -> None:
    assert validate_tokenizer_json(b'{"model": {"type": "BPE"}}') == {"model": {"type": "BPE"}}
    with pytest.raises(CheckpointValidationError, match="tokenizer_config.json: 'auto_map'"):
        validate_tokenizer_json(b'{"auto_map": {"AutoTokenizer": ["x.Tok", null]}}', "tokenizer_config.json")
    with pytest.raises(CheckpointValidationError, match="JSON object"):
        validate_tokenizer_json(b"[1]")


# --- whole directories ------------------------------------------------------------------


def _checkpoint(directory: Path) -> Path:
    directory.mkdir()
    save_file(_tiny_tensors(), str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(CONFIG))
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32}))
    return directory


def test_valid_checkpoint_dir(tmp_path: Path) -> None:
    result = validate_checkpoint_dir(_checkpoint(tmp_path / "ckpt"))
    assert result.config == CONFIG
    assert result.files == ("config.json", "model.safetensors", "tokenizer_config.json")
    assert result.total_bytes == sum(p.stat().st_size for p in (tmp_path / "ckpt").iterdir())


@pytest.mark.parametrize(
    "damage, reason, match",
    [
        (lambda d: (d / "pytorch_model.bin").write_bytes(b"x"), errors.DISALLOWED_FILE, "pickle"),
        (lambda d: (d / "config.json").unlink(), errors.INVALID_CHECKPOINT, "config.json is missing"),
        (lambda d: (d / "model.safetensors").unlink(), errors.INVALID_CHECKPOINT, "safetensors"),
        (
            lambda d: (d / "tokenizer_config.json").write_text('{"auto_map": {}}'),
            errors.INVALID_CHECKPOINT,
            "auto_map",
        ),
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 4),
            errors.INVALID_CHECKPOINT,
            "truncated",
        ),
        (lambda d: (d / "tokenizer.json").mkdir(), errors.DISALLOWED_FILE, "regular file"),
        (
            lambda d: (d / "tokenizer.json").symlink_to("/etc/hostname"),
            errors.DISALLOWED_FILE,
            "regular file",
        ),
        (
            lambda d: (d / "model-00001-of-00002.safetensors").write_bytes(
                (d / "model.safetensors").read_bytes()
            ),
            errors.INVALID_CHECKPOINT,
            "index",
        ),
    ],
)
def test_damaged_checkpoint_dirs_are_refused(tmp_path: Path, damage, reason: str, match: str) -> None:
    directory = _checkpoint(tmp_path / "ckpt")
    damage(directory)
    with pytest.raises(CheckpointValidationError, match=match) as caught:
        validate_checkpoint_dir(directory)
    assert caught.value.reason == reason


def test_sharded_checkpoint_with_index(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path / "ckpt")
    (directory / "model.safetensors").rename(directory / "model-00001-of-00001.safetensors")
    index = {"weight_map": {"embed.weight": "model-00001-of-00001.safetensors"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "model.safetensors.index.json" in validate_checkpoint_dir(directory).files
    index["weight_map"]["norm.weight"] = "model-00002-of-00002.safetensors"
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointValidationError, match="missing shard"):
        validate_checkpoint_dir(directory)


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
