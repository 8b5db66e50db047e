"""What a checkpoint may contain. Both parties agree on these lists: the trainer only
uploads these files and the owner refuses anything else (INVALID_ARGUMENT, nothing stored).

Weights are safetensors only: they cannot execute code. Pickle-based formats (.bin, .pt,
.pth, .pkl, .ckpt) are never accepted, and trust_remote_code is never enabled.

Every check raises `CheckpointValidationError` whose `.reason` is a protocol.errors
reason. Messages name the offending file or key, never echo file contents.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol import errors

# Causal-LM classes whose code ships with transformers itself (no remote code).
ALLOWED_ARCHITECTURES: tuple[str, ...] = (
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "GPT2LMHeadModel",
)

# Exact JSON file names accepted beside the weights.
ALLOWED_JSON_FILES: frozenset[str] = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "model.safetensors.index.json",
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
    return name in ALLOWED_JSON_FILES or bool(SAFETENSORS_NAME.match(name))


class CheckpointValidationError(ValueError):
    """A checkpoint file was refused. `reason` is a protocol.errors reason constant."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def to_protocol_error(self) -> errors.ProtocolError:
        """The INVALID_ARGUMENT status the owner sends back for this refusal."""
        return errors.invalid(self.reason, self.message)


def _refuse(reason: str, message: str) -> CheckpointValidationError:
    return CheckpointValidationError(reason, message)


def _shown(name: str) -> str:
    """A file or key name, safe to put in a message (repr, truncated)."""
    return repr(name[:80] + "..." if len(name) > 80 else name)


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
            f"file {_shown(name)} is not allowed; allowed: model.safetensors (or model-NNNNN-of-NNNNN.safetensors) "
            f"and {', '.join(sorted(ALLOWED_JSON_FILES))}",
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


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _refuse(errors.INVALID_CHECKPOINT, f"duplicate JSON key {_shown(key)}")
        result[key] = value
    return result


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise _refuse(
            errors.INVALID_CHECKPOINT,
            f"{where}: tensor {_shown(name)} shape must be a list of non-negative ints",
        )
    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) and o >= 0 for o in offsets)):
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
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end, dtype = _tensor_bytes(name, entry, where)
        spans.append((begin, end, name))
        dtypes.add(dtype)
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
    return SafetensorsSummary(len(spans), data_bytes, frozenset(dtypes), dict(metadata))


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


def _json_object(data: bytes, file_name: str) -> dict[str, Any]:
    if len(data) > MAX_JSON_FILE_BYTES:
        raise _refuse(errors.UPLOAD_TOO_LARGE, f"{file_name}: larger than {MAX_JSON_FILE_BYTES} bytes")
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_reject_duplicate_keys)
    except CheckpointValidationError as error:
        raise _refuse(error.reason, f"{file_name}: {error.message}") from None
    except (UnicodeDecodeError, ValueError):
        raise _refuse(errors.INVALID_CHECKPOINT, f"{file_name}: not valid UTF-8 JSON") from None
    if not isinstance(value, dict):
        raise _refuse(errors.INVALID_CHECKPOINT, f"{file_name}: must be a JSON object")
    if "auto_map" in value:
        # auto_map points transformers at code shipped with the checkpoint (remote code).
        raise _refuse(errors.INVALID_CHECKPOINT, f"{file_name}: 'auto_map' (custom code) is not allowed")
    return value


def validate_config_json(
    data: bytes, allowed_architectures: Iterable[str] = ALLOWED_ARCHITECTURES
) -> dict[str, Any]:
    """Parse config.json: a JSON object with an allowlisted, non-empty `architectures`
    list, a `model_type`, and no `auto_map`. Returns the parsed object."""
    config = _json_object(data, "config.json")
    allowed = tuple(allowed_architectures)
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise _refuse(errors.INVALID_CHECKPOINT, "config.json: 'architectures' must be a non-empty list")
    for architecture in architectures:
        if not isinstance(architecture, str) or architecture not in allowed:
            shown = _shown(architecture) if isinstance(architecture, str) else "a non-string entry"
            raise _refuse(
                errors.INVALID_CHECKPOINT,
                f"config.json: architecture {shown} is not allowed; allowed: {', '.join(allowed)}",
            )
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise _refuse(errors.INVALID_CHECKPOINT, "config.json: 'model_type' must be a non-empty string")
    return config


def validate_tokenizer_json(data: bytes, file_name: str = "tokenizer.json") -> dict[str, Any]:
    """Parse a tokenizer file (tokenizer.json, tokenizer_config.json, ...): a JSON object
    without `auto_map`. Returns the parsed object."""
    return _json_object(data, file_name)


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
    for shard in set(weight_map.values()):
        if not isinstance(shard, str) or not SAFETENSORS_NAME.match(shard) or shard not in present:
            shown = _shown(shard) if isinstance(shard, str) else "a non-string entry"
            raise _refuse(
                errors.INVALID_CHECKPOINT,
                f"model.safetensors.index.json: weight_map names missing shard {shown}",
            )
    return index


# --- whole checkpoint ---------------------------------------------------------------------


def verify_sha256(path: Path, expected_hex: str) -> None:
    """Raise CHECKSUM_MISMATCH when the file's sha256 differs from the declared one."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected_hex.lower():
        raise _refuse(errors.CHECKSUM_MISMATCH, f"{Path(path).name}: sha256 does not match the manifest")


@dataclass(frozen=True)
class ValidatedCheckpoint:
    config: dict[str, Any]
    files: tuple[str, ...]
    total_bytes: int


def validate_checkpoint_dir(
    directory: Path,
    allowed_architectures: Iterable[str] = ALLOWED_ARCHITECTURES,
    max_total_bytes: int | None = None,
) -> ValidatedCheckpoint:
    """Run every check on a checkpoint directory: only regular, allowlisted files (no
    symlinks or subfolders), config.json present and valid, at least one safetensors
    file, each safetensors file structurally valid, JSON files valid, index consistent."""
    directory = Path(directory)
    entries = sorted(directory.iterdir(), key=lambda p: p.name)
    names = []
    total = 0
    for entry in entries:
        validate_file_name(entry.name)
        if entry.is_symlink() or not entry.is_file():
            raise _refuse(errors.DISALLOWED_FILE, f"{_shown(entry.name)} is not a regular file")
        names.append(entry.name)
        total += entry.stat().st_size
    if max_total_bytes is not None and total > max_total_bytes:
        raise _refuse(
            errors.UPLOAD_TOO_LARGE, f"checkpoint holds {total} bytes, over the {max_total_bytes} limit"
        )
    if "config.json" not in names:
        raise _refuse(errors.INVALID_CHECKPOINT, "config.json is missing")
    shards = [n for n in names if SAFETENSORS_NAME.match(n)]
    if not shards:
        raise _refuse(errors.INVALID_CHECKPOINT, "no model*.safetensors file")
    if len(shards) > 1 and "model.safetensors.index.json" not in names:
        raise _refuse(errors.INVALID_CHECKPOINT, "sharded weights need model.safetensors.index.json")

    config = validate_config_json(_read_json_bytes(directory / "config.json"), allowed_architectures)
    for name in names:
        if name == "config.json":
            continue
        if name == "model.safetensors.index.json":
            validate_index_json(_read_json_bytes(directory / name), shards)
        elif name in ALLOWED_JSON_FILES:
            validate_tokenizer_json(_read_json_bytes(directory / name), name)
        else:
            validate_safetensors(directory / name)
    return ValidatedCheckpoint(config=config, files=tuple(names), total_bytes=total)


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
