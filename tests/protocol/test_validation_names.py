"""File-name allowlist: traversal, hidden files and pickle formats are refused."""

from __future__ import annotations

import pytest

from protocol import errors
from protocol.validation import (
    ALLOWED_JSON_FILES,
    CheckpointValidationError,
    is_allowed_file_name,
    validate_file_name,
)


@pytest.mark.parametrize(
    "name",
    ["model.safetensors", "model-00001-of-00002.safetensors", *sorted(ALLOWED_JSON_FILES)],
)
def test_allowed_names_pass(name: str) -> None:
    assert validate_file_name(name) == name
    assert is_allowed_file_name(name)


@pytest.mark.parametrize(
    "name", ["pytorch_model.bin", "model.pt", "weights.pth", "x.pkl", "last.ckpt", "MODEL.BIN"]
)
def test_pickle_formats_are_never_accepted(name: str) -> None:
    with pytest.raises(CheckpointValidationError, match="pickle-based formats are never accepted") as caught:
        validate_file_name(name)
    assert caught.value.reason == errors.DISALLOWED_FILE


@pytest.mark.parametrize(
    "name, match",
    [
        ("../config.json", "separator"),
        ("..", r"'\.\.'"),
        ("sub/model.safetensors", "separator"),
        ("sub\\model.safetensors", "separator"),
        ("/etc/passwd", "absolute"),
        ("C:config.json", "absolute"),
        ("config.json\x00.txt", "NUL"),
        (".config.json", "hidden"),
        ("", "non-empty"),
        ("a" * 300, "longer"),
        ("model.onnx", "not allowed"),
        ("model-1-of-2.safetensors", "not allowed"),
        ("vocab.txt", "not allowed"),
    ],
)
def test_bad_names_are_refused_with_a_clear_reason(name: str, match: str) -> None:
    with pytest.raises(CheckpointValidationError, match=match) as caught:
        validate_file_name(name)
    assert caught.value.reason == errors.DISALLOWED_FILE
    assert isinstance(caught.value, ValueError)


def test_refusal_maps_to_invalid_argument() -> None:
    with pytest.raises(CheckpointValidationError) as caught:
        validate_file_name("model.pt")
    status = caught.value.to_protocol_error()
    assert status.reason == errors.DISALLOWED_FILE and status.code.name == "INVALID_ARGUMENT"
