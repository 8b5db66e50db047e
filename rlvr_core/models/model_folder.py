"""The trainer's OWN model folder: what `save_pretrained` and the hub write, loaded without running code.

Two loading rules, for two kinds of folder:
- an UPLOAD (what the target owner receives from an untrusted trainer) passes the strict rule,
  protocol.validation.validate_checkpoint_dir, through rlvr_core.models.loading.load_policy;
- the trainer's own local folder (`[model] path`) passes this looser rule: it holds what
  transformers and the hub write, and a trainer who brings its model must not have to trim it.

This rule reads:
- config.json (no `auto_map`: trust_remote_code is never on, so custom model code cannot load);
- weights from safetensors only: model.safetensors, or the shards a model.safetensors.index.json
  names. Pickle files beside them (pytorch_model.bin, training_args.bin, ...) are ignored with a
  warning; a folder with pickle weights only is refused, naming the conversion;
- the tokenizer from tokenizer.json; without one, from tokenizer.model (sentencepiece,
  converted through transformers when sentencepiece is installed) or vocab.json + merges.txt
  (converted through transformers); the tokenizer's chat template (chat_template.jinja,
  chat_template.json or tokenizer_config.json) comes along;
- generation_config.json, special_tokens_map.json and the like as transformers does.
Everything else (README, LICENSE, images, .gitattributes, code files, sub-folders) is ignored.

The tokenizer the trainer trains with is always a PreTrainedTokenizerFast over one
tokenizer.json, the same class and file the owner will load from an upload, so both parties
tokenize alike. What the trainer uploads is built by save_policy from allowlisted files only,
and `check_uploadable` runs the owner's rule on it before anything is sent.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_core.models.loading import UnsafeCheckpointError

log = logging.getLogger("rlvr_core.models")

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
_DOC_FILE = re.compile(r"^(readme|license|licence|notice|copying|citation|model[_-]?card|usage)([._-].*)?$", re.IGNORECASE)
_IGNORED_SUFFIXES = (".md", ".txt", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp", ".pdf", ".py", ".ipynb")
# Files transformers reads from a model folder besides config.json, the weights and the tokenizer.
READ_FILES = frozenset({
    "config.json", "generation_config.json", WEIGHTS_INDEX, "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.json", "merges.txt",
    "chat_template.jinja", "chat_template.json",
})
CONVERT_PICKLE = (
    "convert them to safetensors once, on a machine where you trust these files (loading a pickle runs "
    "code): python -c \"from transformers import AutoModelForCausalLM as M; "
    "M.from_pretrained('{root}', use_safetensors=False).save_pretrained('{root}-safetensors')\" and point "
    "model.path at the new folder"
)


@dataclass(frozen=True)
class ModelFolder:
    """What `inspect_model_folder` found: the files it will read, and what it ignores."""

    root: Path
    weights: tuple[str, ...]
    tokenizer_source: str  # "tokenizer.json", "tokenizer.model" or "vocab.json + merges.txt"
    has_chat_template: bool
    ignored: tuple[str, ...]
    warnings: tuple[str, ...]


def inspect_model_folder(path: str | Path) -> ModelFolder:
    """Check a local transformers causal-LM folder without loading it; UnsafeCheckpointError names the problem."""
    root = Path(path)
    if not root.is_dir():
        raise UnsafeCheckpointError(f"model folder {root} is not a directory")
    entries = {entry.name: entry for entry in root.iterdir()}
    files = {name for name, entry in entries.items() if entry.is_file()}
    if "config.json" not in files:
        raise UnsafeCheckpointError(
            f"{root}: no config.json, so not a transformers model folder (write one with save_pretrained)"
        )
    config = _json_file(root / "config.json")
    for name in ("config.json", "tokenizer_config.json"):
        settings = config if name == "config.json" else (
            _json_file(root / name) if name in files else {})
        if "auto_map" in settings:
            raise UnsafeCheckpointError(
                f"{root / name}: 'auto_map' asks for custom code shipped with the model; trust_remote_code is "
                "never enabled, so use a model whose architecture ships with transformers"
            )
    weights = _weights(root, files)
    pickles = sorted(name for name in files if name.lower().endswith(PICKLE_SUFFIXES))
    warnings = []
    if pickles:
        warnings.append(f"{root}: ignoring {', '.join(pickles)}: pickle files are never loaded; the weights come "
                        f"from {', '.join(weights)}")
    tokenizer_source = _tokenizer_source(root, files)
    has_chat = bool({"chat_template.jinja", "chat_template.json"} & files) or bool(
        "tokenizer_config.json" in files and _json_file(root / "tokenizer_config.json").get("chat_template"))
    read = READ_FILES | set(weights)
    ignored = tuple(sorted(name for name in entries if name not in read and name not in pickles))
    for name in ignored:
        if not (_DOC_FILE.match(name) or name.lower().endswith(_IGNORED_SUFFIXES) or name.startswith(".")):
            log.info("model folder %s: ignoring %s (not a file transformers reads for a causal LM)", root, name)
    return ModelFolder(root, weights, tokenizer_source, has_chat, ignored, tuple(warnings))


def load_model_folder(path: str | Path, device: Any = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) from the trainer's own folder, in eval mode on `device`; nothing downloaded."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from rlvr_core.models.loading import dtype_keyword

    folder = inspect_model_folder(path)
    for warning in folder.warnings:
        log.warning("%s", warning)
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(folder.root.resolve()),
            use_safetensors=True,
            trust_remote_code=False,
            local_files_only=True,
            **{dtype_keyword(): dtype or torch.float32},
        )
    except (OSError, ValueError, KeyError) as error:  # e.g. an architecture this transformers lacks
        raise UnsafeCheckpointError(f"{folder.root}: transformers cannot load this model: {error}") from None
    model.to(device)
    model.eval()
    return model, load_folder_tokenizer(folder)


def load_folder_tokenizer(folder: ModelFolder) -> Any:
    """A PreTrainedTokenizerFast over one tokenizer.json (converted first when the folder has none)."""
    from rlvr_core.models.loading import finish_tokenizer

    if folder.tokenizer_source == "tokenizer.json":
        return finish_tokenizer(_fast_tokenizer(folder.root))
    with tempfile.TemporaryDirectory(prefix="tokenizer-") as scratch:
        converted = _convert_tokenizer(folder)
        converted.save_pretrained(scratch)
        if not (Path(scratch) / "tokenizer.json").is_file():
            raise UnsafeCheckpointError(
                f"{folder.root}: converting {folder.tokenizer_source} did not give a tokenizer.json; convert it with "
                "transformers (AutoTokenizer.from_pretrained(...).save_pretrained(...)) and add tokenizer.json"
            )
        tokenizer = _fast_tokenizer(Path(scratch))
    chat_template = getattr(converted, "chat_template", None)
    if chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = chat_template
    return finish_tokenizer(tokenizer)


def check_uploadable(model: Any, tokenizer: Any) -> None:
    """Build the upload set of (model, tokenizer) in a scratch folder and run the OWNER's rule on it.

    Run before training against an owner, so a model the owner would refuse (an architecture off
    its allowlist, a tokenizer whose ids leave the embedding, ...) stops the run at start instead
    of failing every feedback query. Raises UnsafeCheckpointError with the owner's reason."""
    from rlvr_core.models.loading import save_policy

    with tempfile.TemporaryDirectory(prefix="upload-check-") as scratch:
        try:
            save_policy(model, tokenizer, Path(scratch) / "checkpoint")
        except UnsafeCheckpointError as error:
            raise UnsafeCheckpointError(
                f"the target owner would refuse this model's checkpoints: {error}", error.reason
            ) from None


# -- internals -------------------------------------------------------------------------------

def _json_file(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UnsafeCheckpointError(f"{path}: not a readable JSON file ({type(error).__name__})") from None
    if not isinstance(value, dict):
        raise UnsafeCheckpointError(f"{path}: must hold a JSON object")
    return value


def _weights(root: Path, files: set[str]) -> tuple[str, ...]:
    if WEIGHTS_INDEX in files:
        weight_map = _json_file(root / WEIGHTS_INDEX).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UnsafeCheckpointError(f"{root / WEIGHTS_INDEX}: 'weight_map' must be a non-empty object")
        shards = sorted({str(shard) for shard in weight_map.values()})
        for shard in shards:
            if "/" in shard or "\\" in shard or not shard.endswith(".safetensors"):
                raise UnsafeCheckpointError(f"{root / WEIGHTS_INDEX}: weight_map names {shard!r}, not a "
                                            "safetensors file of this folder")
            if shard not in files:
                raise UnsafeCheckpointError(f"{root / WEIGHTS_INDEX}: shard {shard} is missing from the folder")
        return tuple(shards)
    if WEIGHTS_FILE in files:
        return (WEIGHTS_FILE,)
    pickled = sorted(name for name in files if name.lower().endswith(PICKLE_SUFFIXES))
    if pickled:
        raise UnsafeCheckpointError(
            f"{root}: the weights are pickle files only ({', '.join(pickled)}), which are never loaded: "
            + CONVERT_PICKLE.format(root=root)
        )
    raise UnsafeCheckpointError(
        f"{root}: no safetensors weights ({WEIGHTS_FILE}, or shards listed in {WEIGHTS_INDEX})"
    )


def _tokenizer_source(root: Path, files: set[str]) -> str:
    if "tokenizer.json" in files:
        return "tokenizer.json"
    if "tokenizer.model" in files:
        if importlib.util.find_spec("sentencepiece") is None:
            raise UnsafeCheckpointError(
                f"{root}: the tokenizer is tokenizer.model (sentencepiece) without a tokenizer.json; install "
                "sentencepiece (pip install sentencepiece) to have it converted at load, or convert it once: "
                f"python -c \"from transformers import AutoTokenizer as T; T.from_pretrained('{root}')"
                f".save_pretrained('{root}')\""
            )
        return "tokenizer.model"
    if {"vocab.json", "merges.txt"} <= files:
        return "vocab.json + merges.txt"
    raise UnsafeCheckpointError(
        f"{root}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt); save the tokenizer "
        "beside the model with tokenizer.save_pretrained"
    )


def _fast_tokenizer(directory: Path) -> Any:
    # PreTrainedTokenizerFast directly, not AutoTokenizer: the class is never picked by a config.
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(
        str(directory.resolve()), trust_remote_code=False, local_files_only=True
    )


def _convert_tokenizer(folder: ModelFolder) -> Any:
    """transformers' own conversion of a sentencepiece or vocab/merges tokenizer (built-in classes only)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            str(folder.root.resolve()), trust_remote_code=False, local_files_only=True, use_fast=True
        )
    except Exception as error:  # noqa: BLE001 - many conversion failures; name the source and the fix
        raise UnsafeCheckpointError(
            f"{folder.root}: could not convert {folder.tokenizer_source} to a fast tokenizer "
            f"({type(error).__name__}: {error}); add a tokenizer.json (tokenizer.save_pretrained with a fast "
            "tokenizer writes one)"
        ) from None
