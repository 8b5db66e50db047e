"""What a checkpoint may contain. Both parties agree on these lists: the trainer only
uploads these files and the owner refuses anything else (INVALID_ARGUMENT, nothing stored).

Weights are safetensors only: they cannot execute code. Pickle-based formats (.bin, .pt,
.pth, .pkl, .ckpt) are never accepted, and trust_remote_code is never enabled.

`validate_checkpoint_dir` is THE upload rule, and the model loader runs it too
(rlvr_core.models.loading.check_model_dir), so a checkpoint that passes upload always loads.
Everything that could make an evaluation fail on some prompts and not on others is refused
here, on the uploaded files alone, before anything is charged (issue 11, hole 1): the
tokenizer must only produce ids that are rows of the input embedding (read from the
safetensors header), its pipeline must come from a fixed allowlist (protocol.tokenizer_rules),
and config.json may hold only the keys and values transformers' own config classes write
for the allowed architectures (protocol.config_rules).

Every check raises `CheckpointValidationError` whose `.reason` is a protocol.errors
reason. Messages name the offending file or key, never echo file contents.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol import errors
from protocol.adapter_rules import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_FILES,
    ADAPTER_WEIGHTS_FILE,
    DEFAULT_MAX_ADAPTER_BYTES,
    ValidatedAdapter,
    validate_adapter,
)
from protocol.config_rules import (
    ALLOWED_ARCHITECTURES,
    HIDDEN_SIZE_KEY,
    MODEL_TYPE_OF_ARCHITECTURE,
    REFUSED_CONFIG_KEYS,
    check_config,
    check_token_id_fields,
)
from protocol.refusal import CheckpointValidationError, is_int, key_path, shown
from protocol.tokenizer_rules import (
    check_tokenizer_json,
    check_tokenizer_settings,
    cross_check_with_tokenizers,
)

__all__ = [
    "ALLOWED_ARCHITECTURES",
    "ALLOWED_JSON_FILES",
    "MAX_CHUNK_BYTES",
    "MODEL_TYPE_OF_ARCHITECTURE",
    "CheckpointValidationError",
    "EmbeddingShape",
    "SafetensorsSummary",
    "ValidatedCheckpoint",
    "checkpoint_id_for",
    "embedding_shape",
    "is_allowed_file_name",
    "validate_checkpoint_dir",
    "validate_config_json",
    "validate_file_name",
    "validate_index_json",
    "validate_safetensors",
    "validate_tokenizer_files",
    "verify_sha256",
]

# Exact JSON file names accepted beside the weights.
ALLOWED_JSON_FILES: frozenset[str] = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "model.safetensors.index.json",
        ADAPTER_CONFIG_FILE,
    }
)

# model.safetensors, or shards named as transformers names them.
SAFETENSORS_NAME = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors$")

MAX_CHUNK_BYTES = 1 << 20  # 1 MiB per upload chunk

# Suffixes of formats that unpickle (execute code) on load.
PICKLE_SUFFIXES: tuple[str, ...] = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")

MAX_FILE_NAME_LENGTH = 255
MAX_SAFETENSORS_HEADER_BYTES = 16 << 20  # 16 MiB of JSON header
MAX_JSON_FILE_BYTES = 64 << 20  # tokenizer.json of large vocabularies is ~10-30 MiB

# safetensors dtypes (safetensors 0.8 Dtype enum) and their size in BITS (sub-byte floats).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}


def is_allowed_file_name(name: str) -> bool:
    return name in ALLOWED_JSON_FILES or bool(SAFETENSORS_NAME.match(name)) or name == ADAPTER_WEIGHTS_FILE


def _refuse(reason: str, message: str) -> CheckpointValidationError:
    return CheckpointValidationError(reason, message)


_shown = shown


# --- file names -------------------------------------------------------------------------


def validate_file_name(name: str) -> str:
    """Accept only bare, allowlisted file names; return the name unchanged.

    Refuses path separators, '..', absolute paths, NUL, hidden files, pickle-based
    formats and anything not on the allowlist (reason DISALLOWED_FILE).
    """
    if not isinstance(name, str) or not name:
        raise _refuse(errors.DISALLOWED_FILE, "file name must be a non-empty string")
    if len(name) > MAX_FILE_NAME_LENGTH:
        raise _refuse(errors.DISALLOWED_FILE, f"file name longer than {MAX_FILE_NAME_LENGTH} characters")
    if "\x00" in name:
        raise _refuse(errors.DISALLOWED_FILE, "file name contains a NUL byte")
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise _refuse(errors.DISALLOWED_FILE, f"file name {_shown(name)} is an absolute path")
    if "/" in name or "\\" in name:
        raise _refuse(errors.DISALLOWED_FILE, f"file name {_shown(name)} contains a path separator")
    if ".." in name:
        raise _refuse(errors.DISALLOWED_FILE, f"file name {_shown(name)} contains '..'")
    if name.startswith("."):
        raise _refuse(errors.DISALLOWED_FILE, f"file name {_shown(name)} is a hidden file")
    if name.lower().endswith(PICKLE_SUFFIXES):
        raise _refuse(
            errors.DISALLOWED_FILE,
            f"file {_shown(name)} is refused: pickle-based formats are never accepted; upload safetensors",
        )
    if not is_allowed_file_name(name):
        raise _refuse(
            errors.DISALLOWED_FILE,
            f"file {_shown(name)} is not allowed; allowed: model.safetensors (or model-NNNNN-of-NNNNN.safetensors), "
            f"{ADAPTER_WEIGHTS_FILE} and {', '.join(sorted(ALLOWED_JSON_FILES))}",
        )
    return name


# --- safetensors ------------------------------------------------------------------------


@dataclass(frozen=True)
class SafetensorsSummary:
    """What the header declares (nothing is loaded)."""

    tensor_count: int
    data_bytes: int
    dtypes: frozenset[str]
    metadata: dict[str, str]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # tensor name -> shape


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _refuse(errors.INVALID_CHECKPOINT, f"duplicate JSON key {_shown(key)}")
        result[key] = value
    return result


def _tensor_bytes(name: str, entry: Any, where: str) -> tuple[int, int, str]:
    """Validate one header entry; return (begin, end, dtype)."""
    if not isinstance(entry, dict):
        raise _refuse(errors.INVALID_CHECKPOINT, f"{where}: tensor {_shown(name)} is not a JSON object")
    keys = set(entry)
    if keys != {"dtype", "shape", "data_offsets"}:
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"{where}: tensor {_shown(name)} must have exactly the keys dtype, shape, data_offsets",
        )
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_BITS:
        raise _refuse(errors.INVALID_CHECKPOINT, f"{where}: tensor {_shown(name)} has an unknown dtype")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"{where}: tensor {_shown(name)} shape must be a list of non-negative ints",
        )
    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) and o >= 0 for o in offsets)):
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"{where}: tensor {_shown(name)} data_offsets must be two non-negative ints",
        )
    begin, end = offsets
    if end < begin:
        raise _refuse(
            errors.INVALID_CHECKPOINT, f"{where}: tensor {_shown(name)} data_offsets end before begin"
        )
    elements = 1
    for dim in shape:
        elements *= dim
    bits = elements * SAFETENSORS_DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != end - begin:
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"{where}: tensor {_shown(name)} byte size does not match its dtype and shape",
        )
    return begin, end, dtype


def validate_safetensors(
    path: Path, max_header_bytes: int = MAX_SAFETENSORS_HEADER_BYTES, cross_check: bool = True
) -> SafetensorsSummary:
    """Check a safetensors file's structure without loading any tensor.

    Reads the 8-byte little-endian header length and the JSON header, then checks: the
    length is sane and within the file; the header is a JSON object; every tensor has a
    known dtype, a shape of non-negative ints, and data_offsets whose size matches
    dtype x shape; the offsets are non-overlapping and cover the data section exactly;
    `__metadata__` maps strings to strings. With cross_check, safetensors' own parser
    (safe_open, header only) must agree. Raises CheckpointValidationError(INVALID_CHECKPOINT).
    """
    path = Path(path)
    where = path.name
    size = path.stat().st_size
    if size < 8:
        raise _refuse(
            errors.INVALID_CHECKPOINT, f"{where}: truncated (shorter than the 8-byte header length)"
        )
    with path.open("rb") as handle:
        (header_length,) = struct.unpack("<Q", handle.read(8))
        if header_length < 2:
            raise _refuse(errors.INVALID_CHECKPOINT, f"{where}: header length {header_length} is too small")
        if header_length > max_header_bytes:
            raise _refuse(
                errors.INVALID_CHECKPOINT,
                f"{where}: header length {header_length} exceeds the {max_header_bytes}-byte limit",
            )
        if 8 + header_length > size:
            raise _refuse(
                errors.INVALID_CHECKPOINT, f"{where}: truncated (header extends past the end of the file)"
            )
        raw_header = handle.read(header_length)
    data_bytes = size - 8 - header_length
    try:
        # Trailing spaces are the format's alignment padding.
        header = json.loads(raw_header.decode("utf-8"), object_pairs_hook=_reject_duplicate_keys)
    except CheckpointValidationError as error:
        raise _refuse(error.reason, f"{where}: header has a {error.message}") from None
    except (UnicodeDecodeError, ValueError):
        raise _refuse(errors.INVALID_CHECKPOINT, f"{where}: header is not valid UTF-8 JSON") from None
    if not isinstance(header, dict):
        raise _refuse(errors.INVALID_CHECKPOINT, f"{where}: header is not a JSON object")

    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _refuse(errors.INVALID_CHECKPOINT, f"{where}: __metadata__ must map strings to strings")

    spans = []
    dtypes = set()
    shapes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end, dtype = _tensor_bytes(name, entry, where)
        spans.append((begin, end, name))
        dtypes.add(dtype)
        shapes[name] = tuple(entry["shape"])
    spans.sort()
    position = 0
    for begin, end, name in spans:
        if begin != position:
            problem = "overlaps another tensor" if begin < position else "leaves a gap before it"
            raise _refuse(errors.INVALID_CHECKPOINT, f"{where}: tensor {_shown(name)} {problem}")
        position = end
    if position != data_bytes:
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"{where}: tensors cover {position} bytes but the data section holds {data_bytes} "
            "(truncated file or trailing bytes)",
        )
    if cross_check:
        _cross_check_with_safetensors(path, len(spans))
    return SafetensorsSummary(len(spans), data_bytes, frozenset(dtypes), dict(metadata), shapes)


def _cross_check_with_safetensors(path: Path, tensor_count: int) -> None:
    from safetensors import SafetensorError, safe_open  # header parse + mmap only; no tensor is read

    try:
        with safe_open(str(path), framework="numpy") as handle:
            keys = list(handle.keys())
    except (SafetensorError, OSError, ValueError):
        raise _refuse(errors.INVALID_CHECKPOINT, f"{path.name}: rejected by the safetensors parser") from None
    if len(keys) != tensor_count:
        raise _refuse(
            errors.INVALID_CHECKPOINT, f"{path.name}: safetensors parser disagrees on the tensor count"
        )


# --- JSON files ---------------------------------------------------------------------------

# Files transformers reads for `auto_map` (a request for remote code), at any depth.
_FILES_CHECKED_FOR_AUTO_MAP = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def _json_object(data: bytes, file_name: str) -> dict[str, Any]:
    if len(data) > MAX_JSON_FILE_BYTES:
        raise _refuse(errors.UPLOAD_TOO_LARGE, f"{file_name}: larger than {MAX_JSON_FILE_BYTES} bytes")
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_reject_duplicate_keys)
    except CheckpointValidationError as error:
        raise _refuse(error.reason, f"{file_name}: {error.message}") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _refuse(errors.INVALID_CHECKPOINT, f"{file_name}: not valid UTF-8 JSON") from None
    if not isinstance(value, dict):
        raise _refuse(errors.INVALID_CHECKPOINT, f"{file_name}: must be a JSON object")
    if file_name in _FILES_CHECKED_FOR_AUTO_MAP:
        where = key_path(value, "auto_map")
        if where is not None:
            # auto_map points transformers at code shipped with the checkpoint (remote code).
            raise _refuse(
                errors.INVALID_CHECKPOINT,
                f"{file_name}: {_shown(where)} is not allowed: {REFUSED_CONFIG_KEYS['auto_map']}",
            )
    return value


def validate_config_json(
    data: bytes, allowed_architectures: Iterable[str] = ALLOWED_ARCHITECTURES
) -> dict[str, Any]:
    """Parse and check config.json (protocol.config_rules.check_config: allowlisted
    architectures, the matching model_type, only the keys and values transformers' own config
    class writes, no `auto_map` or `quantization_config` anywhere). Returns the parsed object."""
    config = _json_object(data, "config.json")
    check_config(config, allowed_architectures)
    return config


def validate_index_json(data: bytes, present_files: Iterable[str]) -> dict[str, Any]:
    """model.safetensors.index.json: `weight_map` must point only at allowlisted shard
    names that are present in the checkpoint."""
    index = _json_object(data, "model.safetensors.index.json")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise _refuse(
            errors.INVALID_CHECKPOINT, "model.safetensors.index.json: 'weight_map' must be a non-empty object"
        )
    present = set(present_files)
    for shard in weight_map.values():
        if not isinstance(shard, str) or not SAFETENSORS_NAME.match(shard):
            raise _refuse(
                errors.INVALID_CHECKPOINT,
                f"model.safetensors.index.json: weight_map names a disallowed shard {_shown(shard)}",
            )
        if shard not in present:
            raise _refuse(
                errors.INVALID_CHECKPOINT,
                f"model.safetensors.index.json: weight_map names missing shard {_shown(shard)}",
            )
    return index


# --- weights as the loader will see them ------------------------------------------------------


@dataclass(frozen=True)
class EmbeddingNames:
    """Where an architecture keeps its input embedding and output head (transformers' names)."""

    base_prefix: str  # the base model's attribute: "model" (Qwen2, Llama, ...) or "transformer" (GPT-2)
    embedding: str  # under the base prefix
    head: str = "lm_head.weight"


EMBEDDING_OF_ARCHITECTURE: dict[str, EmbeddingNames] = {
    "Qwen2ForCausalLM": EmbeddingNames("model", "embed_tokens.weight"),
    "Qwen3ForCausalLM": EmbeddingNames("model", "embed_tokens.weight"),
    "LlamaForCausalLM": EmbeddingNames("model", "embed_tokens.weight"),
    "MistralForCausalLM": EmbeddingNames("model", "embed_tokens.weight"),
    "GPT2LMHeadModel": EmbeddingNames("transformer", "wte.weight"),
}


@dataclass(frozen=True)
class EmbeddingShape:
    """The input embedding as the safetensors headers declare it (no tensor is loaded)."""

    tensor: str  # e.g. "model.embed_tokens.weight"
    rows: int  # every token id must be below this
    width: int


def embedding_shape(architecture: str, shapes: dict[str, tuple[int, ...]]) -> EmbeddingShape:
    """Find the input embedding of `architecture` among the tensors of a checkpoint (name ->
    shape, all shards together) and check the output head against it.

    A checkpoint whose tensors carry no base-model prefix (GPT-2's original hub weights) is
    loaded with the prefix added, so the unprefixed name is used for it. The output head, when
    stored, must have exactly the embedding's shape: a generated id must be embeddable when it
    is fed back. Without a stored head the weights are tied (or the head is created with the
    config's vocab_size rows, which must equal the embedding's).
    """
    names = EMBEDDING_OF_ARCHITECTURE[architecture]
    prefixed = any(name.startswith(names.base_prefix + ".") for name in shapes)
    tensor = f"{names.base_prefix}.{names.embedding}" if prefixed else names.embedding
    shape = shapes.get(tensor)
    if shape is None:
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"the weights hold no input embedding {tensor!r} (needed for {architecture}); without it "
            "the owner cannot check the tokenizer's ids against the embedding",
        )
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise _refuse(errors.INVALID_CHECKPOINT, f"the input embedding {tensor!r} must be a non-empty matrix")
    head = shapes.get(names.head)
    if head is not None and tuple(head) != tuple(shape):
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"the output head {names.head!r} has shape {list(head)} but the input embedding {tensor!r} has "
            f"{list(shape)}: every id the head can generate must be a row of the embedding",
        )
    return EmbeddingShape(tensor=tensor, rows=shape[0], width=shape[1])


def _check_weight_layout(names: list[str], headers: dict[str, SafetensorsSummary], directory: Path) -> None:
    """The weight files must be exactly what the loader reads: model.safetensors alone, or
    shards listed by model.safetensors.index.json whose weight_map matches their headers."""
    shards = sorted(headers)
    has_index = "model.safetensors.index.json" in names
    if "model.safetensors" in shards:
        if len(shards) > 1 or has_index:
            raise _refuse(
                errors.INVALID_CHECKPOINT,
                "model.safetensors must be the only weights file (no shards, no index): the loader would "
                "read model.safetensors and ignore the rest",
            )
        return
    if not has_index:
        raise _refuse(errors.INVALID_CHECKPOINT, "sharded weights need model.safetensors.index.json")
    weight_map = validate_index_json(_read_json_bytes(directory / "model.safetensors.index.json"), shards)[
        "weight_map"
    ]
    holder: dict[str, str] = {}
    for shard in shards:
        for tensor in headers[shard].shapes:
            if tensor in holder:
                raise _refuse(
                    errors.INVALID_CHECKPOINT, f"tensor {_shown(tensor)} is stored in two shards ({shard})"
                )
            holder[tensor] = shard
    for tensor, shard in weight_map.items():
        if holder.get(tensor) != shard:
            raise _refuse(
                errors.INVALID_CHECKPOINT,
                f"model.safetensors.index.json: weight_map puts {_shown(tensor)} in {_shown(shard)}, "
                "whose header does not hold it",
            )
    unmapped = sorted(set(holder) - set(weight_map))
    if unmapped:
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"model.safetensors.index.json: weight_map leaves out tensor {_shown(unmapped[0])} "
            f"of {_shown(holder[unmapped[0]])} (the loader would skip it)",
        )


# --- tokenizer files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizerSummary:
    token_count: int  # tokens tokenizer.json defines (vocabulary and added tokens)
    eos_token_id: int


def validate_tokenizer_files(
    tokenizer_json: bytes,
    embedding: EmbeddingShape,
    tokenizer_config: bytes | None = None,
    special_tokens_map: bytes | None = None,
    cross_check: bool = True,
) -> TokenizerSummary:
    """Check the tokenizer files against the input embedding (protocol.tokenizer_rules): every
    id below embedding.rows, only allowlisted pipeline components, special tokens that exist,
    an EOS, no chat template or auto_map. With cross_check the tokenizers library must load
    tokenizer.json and agree on the ids."""
    parsed = _json_object(tokenizer_json, "tokenizer.json")
    token_ids = check_tokenizer_json(parsed, embedding.rows, embedding.tensor)
    config = None if tokenizer_config is None else _json_object(tokenizer_config, "tokenizer_config.json")
    special = None
    if special_tokens_map is not None:
        special = _json_object(special_tokens_map, "special_tokens_map.json")
    eos = check_tokenizer_settings(config, special, token_ids)
    if cross_check:
        cross_check_with_tokenizers(tokenizer_json.decode("utf-8"), embedding.rows)
    return TokenizerSummary(token_count=len(token_ids), eos_token_id=eos)


# --- whole checkpoint ---------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    """The file's sha256, hex: the content address of a checkpoint file on either side of the wire."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected_hex: str) -> None:
    """Raise CHECKSUM_MISMATCH when the file's sha256 differs from the declared one."""
    if sha256_file(path) != expected_hex.lower():
        raise _refuse(errors.CHECKSUM_MISMATCH, f"{Path(path).name}: sha256 does not match the manifest")


@dataclass(frozen=True)
class ValidatedCheckpoint:
    config: dict[str, Any]
    files: tuple[str, ...]
    total_bytes: int
    embedding: EmbeddingShape | None = None
    tokenizer: TokenizerSummary | None = None
    adapter: ValidatedAdapter | None = None
    """The LoRA adapter beside the base weights (protocol.adapter_rules), if the folder has one."""


REQUIRED_FILES = ("config.json", "tokenizer.json")
_OPTIONAL_JSON_FILES = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json")


def validate_checkpoint_dir(
    directory: Path,
    allowed_architectures: Iterable[str] = ALLOWED_ARCHITECTURES,
    max_total_bytes: int | None = None,
    max_adapter_bytes: int = DEFAULT_MAX_ADAPTER_BYTES,
) -> ValidatedCheckpoint:
    """Run every upload check on a checkpoint directory; the model loader runs the same.

    Files: only regular, allowlisted files (no symlinks or subfolders); config.json,
    tokenizer.json and safetensors weights present; each safetensors header structurally
    valid; model.safetensors alone or shards that match their index. Contents: config.json
    passes protocol.config_rules; its vocab_size and hidden size match the input embedding
    read from the headers; the output head has the embedding's shape; every token id in
    config.json / generation_config.json and every id the tokenizer can produce is a row of the
    embedding; the tokenizer passes protocol.tokenizer_rules. A LoRA adapter (adapter_config.json
    with adapter_model.safetensors) must fit the base weights (protocol.adapter_rules).
    """
    directory = Path(directory)
    entries = sorted(directory.iterdir(), key=lambda p: p.name)
    names = []
    total = 0
    for entry in entries:
        validate_file_name(entry.name)
        if entry.is_symlink():
            raise _refuse(
                errors.DISALLOWED_FILE, f"{_shown(entry.name)} is a symlink; only regular files are allowed"
            )
        if not entry.is_file():
            raise _refuse(errors.DISALLOWED_FILE, f"{_shown(entry.name)} is not a regular file")
        names.append(entry.name)
        total += entry.stat().st_size
    if max_total_bytes is not None and total > max_total_bytes:
        raise _refuse(
            errors.UPLOAD_TOO_LARGE, f"checkpoint holds {total} bytes, over the {max_total_bytes} limit"
        )
    for required in REQUIRED_FILES:
        if required not in names:
            raise _refuse(errors.INVALID_CHECKPOINT, f"{required} is missing")
    shards = [n for n in names if SAFETENSORS_NAME.match(n)]
    if not shards:
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            "no safetensors weights (model.safetensors, or model-NNNNN-of-NNNNN.safetensors shards)",
        )

    config = validate_config_json(_read_json_bytes(directory / "config.json"), allowed_architectures)
    headers = {shard: validate_safetensors(directory / shard) for shard in shards}
    _check_weight_layout(names, headers, directory)
    shapes = {tensor: shape for summary in headers.values() for tensor, shape in summary.shapes.items()}
    embedding = embedding_shape(config["architectures"][0], shapes)
    _check_config_against_embedding(config, embedding)
    present = {name: _read_json_bytes(directory / name) for name in _OPTIONAL_JSON_FILES if name in names}
    if "generation_config.json" in present:
        generation = _json_object(present["generation_config.json"], "generation_config.json")
        check_token_id_fields(generation, embedding.rows, embedding.tensor, "generation_config.json")
    tokenizer = validate_tokenizer_files(
        _read_json_bytes(directory / "tokenizer.json"),
        embedding,
        present.get("tokenizer_config.json"),
        present.get("special_tokens_map.json"),
    )
    adapter = None
    present_adapter = [name for name in ADAPTER_FILES if name in names]
    if present_adapter:
        if len(present_adapter) != len(ADAPTER_FILES):
            missing = next(name for name in ADAPTER_FILES if name not in names)
            raise _refuse(errors.INVALID_CHECKPOINT, f"a LoRA adapter needs both {' and '.join(ADAPTER_FILES)}; "
                          f"{missing} is missing")
        adapter = validate_adapter(
            _read_json_bytes(directory / ADAPTER_CONFIG_FILE), directory / ADAPTER_WEIGHTS_FILE,
            config["architectures"][0], shapes, embedding.tensor, max_adapter_bytes,
        )
    return ValidatedCheckpoint(
        config=config, files=tuple(names), total_bytes=total, embedding=embedding, tokenizer=tokenizer,
        adapter=adapter,
    )


def _check_config_against_embedding(config: dict[str, Any], embedding: EmbeddingShape) -> None:
    """transformers builds the model from config.json and refuses weights of another shape, so
    a mismatch would fail at load, after the charge."""
    if config["vocab_size"] != embedding.rows:
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"config.json: 'vocab_size' is {config['vocab_size']} but the input embedding {embedding.tensor} "
            f"has {embedding.rows} rows (transformers refuses to load a mismatch)",
        )
    hidden_key = HIDDEN_SIZE_KEY.get(config["model_type"], "hidden_size")
    if config[hidden_key] != embedding.width:
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"config.json: {hidden_key!r} is {config[hidden_key]} but the input embedding {embedding.tensor} "
            f"is {embedding.width} wide",
        )
    check_token_id_fields(config, embedding.rows, embedding.tensor, "config.json")


def _read_json_bytes(path: Path) -> bytes:
    if path.stat().st_size > MAX_JSON_FILE_BYTES:
        raise _refuse(errors.UPLOAD_TOO_LARGE, f"{path.name}: larger than {MAX_JSON_FILE_BYTES} bytes")
    return path.read_bytes()


def checkpoint_id_for(files) -> str:
    """The protocol's content address of a checkpoint: sha256 over its manifest sorted by
    name, as compact canonical JSON [[name, size, sha256], ...]. Any object with `name`,
    `size` and `sha256` attributes works (a proto FileEntry or the owner's manifest entry)."""
    import hashlib
    import json

    rows = sorted([entry.name, int(entry.size), entry.sha256] for entry in files)
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode("utf-8")).hexdigest()
