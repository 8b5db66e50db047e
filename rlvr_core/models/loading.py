"""Load and save policy checkpoints without ever executing code from them.

This is the UPLOAD rule (the trainer's own model folder has a looser one,
rlvr_core/models/model_folder.py). A checkpoint directory is untrusted input (the target owner
receives it over the wire), so loading is gated by `check_model_dir`, which runs exactly the owner's upload rule
(protocol.validation.validate_checkpoint_dir): only allowlisted file names (safetensors weights
and a few JSON files), only causal-LM classes that ship with transformers with their own config
keys, no `auto_map` (how a config asks for remote code) or `quantization_config`, and a tokenizer
whose every id is a row of the embedding. One rule in both places means a checkpoint can never
pass upload and then fail to load after a privacy charge. Weights are read with
`use_safetensors=True`; nothing here calls torch.load or unpickles anything.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from protocol.validation import (
    MODEL_TYPE_OF_ARCHITECTURE,
    CheckpointValidationError,
    is_allowed_file_name,
    validate_checkpoint_dir,
)

__all__ = [
    "MODEL_TYPE_OF_ARCHITECTURE",
    "UnsafeCheckpointError",
    "check_model_dir",
    "dtype_keyword",
    "finish_tokenizer",
    "load_policy",
    "load_tokenizer",
    "save_policy",
]


class UnsafeCheckpointError(ValueError):
    """A checkpoint directory is malformed or could make the loader run code.

    `reason` is the protocol.errors reason the owner's upload path would have refused it with."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


def check_model_dir(path: str | Path) -> dict[str, Any]:
    """Validate a checkpoint directory with the upload rule and return its parsed config.json.

    Raises UnsafeCheckpointError naming the offending file or field for anything
    protocol.validation.validate_checkpoint_dir refuses: files that are not allowlisted (pickle
    weights, stray files, sub-directories, symlinks), missing weights, config.json or
    tokenizer.json, an architecture or config key outside the allowlists, `auto_map`, a
    tokenizer id past the embedding, and so on. Reads names, JSON files and safetensors
    headers, never the weights themselves.
    """
    root = Path(path)
    if not root.is_dir():
        raise UnsafeCheckpointError(f"checkpoint path is not a directory: {root}")
    try:
        return validate_checkpoint_dir(root).config
    except CheckpointValidationError as error:
        raise UnsafeCheckpointError(f"checkpoint {root.name}: {error.message}", error.reason) from error


def dtype_keyword() -> str:
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
    return finish_tokenizer(tokenizer)


def finish_tokenizer(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """What both loaders do to a loaded tokenizer: forget where it came from, pad on the left."""
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
        **{dtype_keyword(): dtype},
    )
    model.to(device)
    model.eval()
    return model, load_tokenizer(root)


def save_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    out_dir: str | Path,
    overwrite: bool = False,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Save model and tokenizer as safetensors + allowlisted JSON, and check the result.

    `out_dir` must be new or empty (so stale shards from an earlier save can never mix in);
    with `overwrite=True` an existing directory is cleared first, but only if every file in
    it is allowlisted. Files transformers writes beyond the allowlist (e.g. chat_template.jinja)
    are deleted, and so is a chat template inside tokenizer_config.json: the owner renders
    prompts with its own declared rendering and refuses uploaded Jinja. For a given transformers version identical weights give identical bytes,
    so the directory can be content-addressed. `state_dict` (default: the model's own) is what is
    written as the weights, e.g. a LoRA-wrapped model's base weights under their plain names.
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
    model.save_pretrained(str(root), safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(str(root))
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif not is_allowed_file_name(entry.name):
            entry.unlink()
    _drop_chat_template(root / "tokenizer_config.json")
    if not (root / "tokenizer.json").is_file():
        raise UnsafeCheckpointError("save_policy: tokenizer did not write tokenizer.json (slow tokenizer?)")
    check_model_dir(root)
    return root


def _drop_chat_template(path: Path) -> None:
    """Remove a `chat_template` key some transformers versions write into tokenizer_config.json."""
    if not path.is_file():
        return
    settings = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(settings, dict) and "chat_template" in settings:
        del settings["chat_template"]
        path.write_text(json.dumps(settings, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
