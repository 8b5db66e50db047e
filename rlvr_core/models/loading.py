"""Load and save policy checkpoints without ever executing code from them.

A checkpoint directory is untrusted input (the target owner receives it over the wire), so
loading is gated by `check_model_dir`: only allowlisted file names (safetensors weights and a
few JSON files, see protocol/validation.py), only causal-LM classes that ship with
transformers, and no `auto_map` (which is how a config asks for remote code). Weights are read
with `use_safetensors=True`; nothing here calls torch.load or unpickles anything.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from protocol.validation import ALLOWED_ARCHITECTURES, SAFETENSORS_NAME, is_allowed_file_name

# AutoModelForCausalLM picks the class from `model_type`, not from `architectures`, so both must
# agree: otherwise a config could name an allowed architecture and load a different class.
MODEL_TYPE_OF_ARCHITECTURE: dict[str, str] = {
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "GPT2LMHeadModel": "gpt2",
}

# Files whose JSON may carry an `auto_map` (a request for remote code).
_JSON_FILES_CHECKED_FOR_REMOTE_CODE = ("config.json", "tokenizer_config.json")


class UnsafeCheckpointError(ValueError):
    """A checkpoint directory is malformed or could make the loader run code."""


def check_model_dir(path: str | Path) -> dict[str, Any]:
    """Validate a checkpoint directory and return its parsed config.json.

    Raises UnsafeCheckpointError naming the offending file or field when the directory holds a
    file that is not allowlisted (pickle weights, stray files, sub-directories, symlinks), has
    no safetensors weights, names an architecture outside ALLOWED_ARCHITECTURES, or asks for
    remote code through `auto_map`. Reads only names and small JSON files, never weights.
    """
    root = Path(path)
    if not root.is_dir():
        raise UnsafeCheckpointError(f"checkpoint path is not a directory: {root}")
    names = sorted(entry.name for entry in root.iterdir())
    for name in names:
        entry = root / name
        if entry.is_symlink():
            raise UnsafeCheckpointError(f"checkpoint file {name!r} is a symlink; only regular files are allowed")
        if not entry.is_file():
            raise UnsafeCheckpointError(f"checkpoint entry {name!r} is not a regular file")
        if not is_allowed_file_name(name):
            raise UnsafeCheckpointError(
                f"checkpoint file {name!r} is not allowed: only safetensors weights and "
                "allowlisted JSON files may be present (pickle formats are never loaded)"
            )
    weight_files = [name for name in names if SAFETENSORS_NAME.match(name)]
    if not weight_files:
        raise UnsafeCheckpointError("checkpoint has no safetensors weights (model*.safetensors)")
    if "config.json" not in names:
        raise UnsafeCheckpointError("checkpoint has no config.json")

    config = _read_json_object(root, "config.json")
    _check_architecture(config)
    for name in _JSON_FILES_CHECKED_FOR_REMOTE_CODE:
        if name in names and _contains_key(_read_json_object(root, name), "auto_map"):
            raise UnsafeCheckpointError(f"{name} contains 'auto_map' (remote code is never loaded)")
    if "model.safetensors.index.json" in names:
        _check_shard_index(root, set(names))
    return config


def _read_json_object(root: Path, name: str) -> dict[str, Any]:
    try:
        value = json.loads((root / name).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UnsafeCheckpointError(f"{name} is not valid UTF-8 JSON: {error}") from error
    if not isinstance(value, dict):
        raise UnsafeCheckpointError(f"{name} must hold a JSON object")
    return value


def _check_architecture(config: dict[str, Any]) -> None:
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise UnsafeCheckpointError("config.json field 'architectures' must be a non-empty list")
    for architecture in architectures:
        if architecture not in ALLOWED_ARCHITECTURES:
            raise UnsafeCheckpointError(
                f"config.json field 'architectures' names {architecture!r}, "
                f"allowed: {', '.join(ALLOWED_ARCHITECTURES)}"
            )
        expected_type = MODEL_TYPE_OF_ARCHITECTURE[architecture]
        if config.get("model_type") != expected_type:
            raise UnsafeCheckpointError(
                f"config.json field 'model_type' is {config.get('model_type')!r} but "
                f"architecture {architecture} needs {expected_type!r}"
            )


def _contains_key(value: Any, key: str) -> bool:
    """True when `key` occurs as a mapping key anywhere inside a parsed JSON value."""
    if isinstance(value, dict):
        return key in value or any(_contains_key(child, key) for child in value.values())
    if isinstance(value, list):
        return any(_contains_key(child, key) for child in value)
    return False


def _check_shard_index(root: Path, names: set[str]) -> None:
    index = _read_json_object(root, "model.safetensors.index.json")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise UnsafeCheckpointError("model.safetensors.index.json field 'weight_map' must be an object")
    for shard in set(weight_map.values()):
        if not isinstance(shard, str) or not SAFETENSORS_NAME.match(shard):
            raise UnsafeCheckpointError(f"model.safetensors.index.json names a disallowed shard {shard!r}")
        if shard not in names:
            raise UnsafeCheckpointError(f"model.safetensors.index.json names a missing shard {shard!r}")


def _dtype_keyword() -> str:
    """transformers >= 4.56 calls the argument `dtype`; older releases call it `torch_dtype`."""
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load the fast tokenizer of a checked checkpoint directory (tokenizer.json only).

    PreTrainedTokenizerFast is used directly rather than AutoTokenizer so that the tokenizer
    class is never chosen by the (untrusted) config.
    """
    root = Path(path)
    if not (root / "tokenizer.json").is_file():
        raise UnsafeCheckpointError("checkpoint has no tokenizer.json")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(
        str(root.resolve()), trust_remote_code=False, local_files_only=True
    )
    # Loading records where it came from; left in, a re-saved tokenizer_config.json would differ
    # from the original and break content addressing of checkpoints.
    for key in ("is_local", "local_files_only", "name_or_path"):
        tokenizer.init_kwargs.pop(key, None)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # decoder-only generation pads on the left
    return tokenizer


def load_policy(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Validate `path` with check_model_dir, then load (model, tokenizer) from local safetensors.

    The model comes back in eval mode on `device`. Nothing is downloaded: the path is resolved
    to an absolute local directory and `local_files_only=True` is passed.
    """
    check_model_dir(path)
    root = str(Path(path).resolve())
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        root,
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
        **{_dtype_keyword(): dtype},
    )
    model.to(device)
    model.eval()
    return model, load_tokenizer(root)


def save_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    out_dir: str | Path,
    overwrite: bool = False,
) -> Path:
    """Save model and tokenizer as safetensors + allowlisted JSON, and check the result.

    `out_dir` must be new or empty (so stale shards from an earlier save can never mix in);
    with `overwrite=True` an existing directory is cleared first, but only if every file in
    it is allowlisted. Files transformers writes beyond the allowlist (e.g. a chat template)
    are deleted. For a given transformers version identical weights give identical bytes,
    so the directory can be content-addressed.
    """
    root = Path(out_dir)
    if root.exists():
        existing = sorted(root.iterdir())
        if existing and not overwrite:
            raise FileExistsError(f"save_policy: output directory {root} is not empty")
        for entry in existing:
            if not (entry.is_file() and is_allowed_file_name(entry.name)):
                raise FileExistsError(f"save_policy: refusing to clear {root}: it holds {entry.name!r}")
            entry.unlink()
    root.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    # Per-save progress bars ("Writing model shards") flood the output of runs that save
    # a candidate checkpoint every few steps.
    hf_logging.disable_progress_bar()
    model.save_pretrained(str(root), safe_serialization=True)
    tokenizer.save_pretrained(str(root))
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif not is_allowed_file_name(entry.name):
            entry.unlink()
    check_model_dir(root)
    if not (root / "tokenizer.json").is_file():
        raise UnsafeCheckpointError("save_policy: tokenizer did not write tokenizer.json (slow tokenizer?)")
    return root
