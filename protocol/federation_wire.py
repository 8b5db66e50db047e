"""What a Flower message between the trainer's ServerApp and an owner's shim may carry.

Both sides use this one schema (trainer_node/federation sends, flower_shim/ forwards), so the
shim can refuse anything else: a message is one public RPC of target_feedback.v1, named by its
action (`query.<action>`), with exactly the records listed here. There is no record for
per-example data because no public RPC returns any.

Candidates travel as an ArrayRecord of their tensors (Flower's array type is numpy's, which has
no bfloat16: a BF16 tensor goes as its uint16 bit pattern and the safetensors dtype is recorded
beside it, so the conversion is explicit and exact) and their config JSON files as bytes. The
small safetensors codec below needs no torch: a safetensors file is an 8-byte header length, a
JSON header and the raw little-endian tensor bytes; the header travels verbatim, so the shim
rebuilds each file byte for byte and its sha256 is the one the trainer computed.

Large candidates: an upload carries a manifest of every file (size, sha256) but only the files
the owner does not already hold, the direct path's content-address reuse:
with the trainer's per-tensor shards, a candidate that changes k of T tensors carries about k/T
of the bytes; a LoRA run's candidate carries its adapter_model.safetensors (as tensors, like a
shard) and nothing else once the owner holds the base.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Container, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from protocol.validation import sha256_file

ACTIONS = ("info", "budget", "upload", "evaluate")
MESSAGE_CATEGORY = "query"  # Flower message types are "<category>.<action>"

# action -> {record name: record kind}; a message with any other record is refused.
REQUEST_RECORDS: dict[str, dict[str, str]] = {
    "info": {},
    "budget": {},
    "upload": {"tensors": "array", "files": "config"},
    "evaluate": {"request": "config"},
}
TENSOR_META_KEY = "__tensors__"   # in "files": JSON {weights file: {"header", "tensors": {name: [dtype, shape]}}}
MANIFEST_KEY = "__manifest__"     # in "files": JSON {file name: [size, sha256]}, every file, carried or held
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
EVALUATE_REQUEST_KEY = "evaluate_request"  # in "request": a serialized EvaluateRequest
REPLY_RECORD = "reply"            # ConfigRecord: "response" (serialized reply) or "checkpoint_id", "bytes_received"
ERROR_RECORD = "error"            # ConfigRecord: "code", "reason", "message", "status" (the owner's, verbatim)

# safetensors dtype -> the numpy dtype its bytes travel as (BF16: the bit pattern as uint16)
STORAGE_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "uint16", "I64": "int64",
                  "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class WireError(ValueError):
    """A message or file that does not follow this schema; the text names what is wrong."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str            # safetensors dtype, e.g. "BF16"
    shape: tuple[int, ...]
    data: bytes


def read_safetensors(path: Path) -> tuple[bytes, list[Tensor]]:
    """(the header's JSON bytes as written, the tensors): the header travels verbatim so the
    owner's shim rebuilds the very file, and its sha256 (the content address) stays the same."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise WireError(f"{path}: not a safetensors file (shorter than its header length)")
    (size,) = struct.unpack("<Q", raw[:8])
    header_bytes = raw[8:8 + size]
    try:
        header = json.loads(header_bytes)
    except ValueError as error:
        raise WireError(f"{path}: safetensors header is not JSON ({error})") from None
    header.pop("__metadata__", None)
    body = raw[8 + size:]
    tensors = []
    for name, spec in sorted(header.items()):
        begin, end = spec["data_offsets"]
        tensors.append(Tensor(name, spec["dtype"], tuple(spec["shape"]), body[begin:end]))
    return header_bytes, tensors


def write_safetensors(path: Path, header_bytes: bytes, tensors: list[Tensor]) -> None:
    """The file `read_safetensors` read, byte for byte: refuses a header that disagrees with the
    tensors carried (names, dtypes, shapes, or offsets that do not tile the body in order)."""
    try:
        header = json.loads(header_bytes)
        header.pop("__metadata__", None)
        specs = {name: (spec["dtype"], tuple(spec["shape"]), tuple(spec["data_offsets"]))
                 for name, spec in header.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise WireError(f"query.upload: {path.name}: its safetensors header is not valid ({error!r})") from None
    carried = {tensor.name: tensor for tensor in tensors}
    if set(specs) != set(carried):
        raise WireError(f"query.upload: {path.name}: the header lists other tensors than the arrays carry")
    offset = 0
    ordered = []
    for name, (dtype, shape, (begin, end)) in sorted(specs.items(), key=lambda item: item[1][2]):
        tensor = carried[name]
        if (dtype, shape) != (tensor.dtype, tensor.shape) or begin != offset or end - begin != len(tensor.data):
            raise WireError(f"query.upload: {path.name}: tensor {name!r} disagrees with its header entry")
        offset = end
        ordered.append(tensor)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header_bytes)) + header_bytes)
        for tensor in ordered:
            fh.write(tensor.data)


def to_array(tensor: Tensor) -> np.ndarray:
    """The ndarray a tensor travels as: its exact bytes, viewed in its storage dtype."""
    if tensor.dtype not in STORAGE_DTYPES:
        raise WireError(f"tensor {tensor.name!r}: dtype {tensor.dtype} cannot travel; "
                        f"known: {', '.join(STORAGE_DTYPES)}")
    return np.frombuffer(tensor.data, dtype=STORAGE_DTYPES[tensor.dtype]).reshape(tensor.shape)


def from_array(name: str, dtype: str, shape: list[int], array: np.ndarray) -> Tensor:
    """Back from the wire: refuses a dtype or shape that disagrees with the recorded one."""
    if STORAGE_DTYPES.get(dtype) != str(array.dtype) or tuple(array.shape) != tuple(shape):
        raise WireError(f"tensor {name!r}: declared {dtype} {list(shape)}, carried {array.dtype} {list(array.shape)}")
    return Tensor(name, dtype, tuple(shape), np.ascontiguousarray(array).tobytes())


def check_request(action: str, records: dict[str, str], config_keys: dict[str, set[str]]) -> None:
    """Refuse a message that is not exactly one public RPC: an unknown action, a record this
    action does not take or of the wrong kind, or an unknown key in one of its records.

    `records` maps record name -> kind ("array" | "config" | "metric"); `config_keys` maps each
    config record's name to its keys."""
    if action not in REQUEST_RECORDS:
        raise WireError(f"message action {action!r} is not a public RPC; allowed: {', '.join(ACTIONS)}")
    expected = REQUEST_RECORDS[action]
    unknown = sorted(set(records) - set(expected))
    missing = sorted(set(expected) - set(records))
    if unknown or missing:
        raise WireError(f"query.{action}: " + "; ".join(
            ([f"unknown record(s) {', '.join(unknown)}"] if unknown else [])
            + ([f"missing record(s) {', '.join(missing)}"] if missing else [])))
    for name, kind in records.items():
        if kind != expected[name]:
            raise WireError(f"query.{action}: record {name!r} must be a {expected[name]} record, not {kind}")
    if action == "evaluate" and config_keys.get("request", set()) != {EVALUATE_REQUEST_KEY}:
        raise WireError(f"query.evaluate: record 'request' takes exactly the key {EVALUATE_REQUEST_KEY!r}")
    if action == "upload":
        from protocol.validation import ALLOWED_JSON_FILES

        bad = sorted(config_keys.get("files", set()) - set(ALLOWED_JSON_FILES) - {TENSOR_META_KEY, MANIFEST_KEY})
        if bad:
            raise WireError(f"query.upload: record 'files' has keys that are not allowlisted config files: "
                            f"{', '.join(bad)}")




def is_weights_file(name: str) -> bool:
    """A safetensors file that travels as arrays: a model shard or a LoRA adapter's weights."""
    from protocol.adapter_rules import ADAPTER_WEIGHTS_FILE
    from protocol.validation import SAFETENSORS_NAME

    return bool(SAFETENSORS_NAME.match(name)) or name == ADAPTER_WEIGHTS_FILE


def encode_checkpoint(folder: Path, digests: Mapping[str, str] | None = None,
                      held: Container[str] = ()) -> tuple[dict[str, np.ndarray], dict[str, bytes]]:
    """A checkpoint folder as (arrays keyed "<weights file>::<tensor>", config files by name, the
    tensor table under TENSOR_META_KEY and the manifest under MANIFEST_KEY). Only allowlisted
    names travel.

    The manifest lists every file (size, sha256: `digests` where the caller has them, else hashed);
    a file whose sha256 is in `held` (what the owner already stores) is listed but not carried, as
    on the direct path: a candidate whose k of T per-tensor shards changed (the trainer's candidate
    writer) carries about k/T of the weight bytes."""
    from protocol.validation import SAFETENSORS_NAME, is_allowed_file_name

    arrays: dict[str, np.ndarray] = {}
    files: dict[str, bytes] = {}
    table: dict[str, Any] = {}
    manifest: dict[str, list[Any]] = {}
    digests = digests or {}
    for path in sorted(Path(folder).iterdir()):
        if not path.is_file():
            continue
        if not is_allowed_file_name(path.name):
            raise WireError(f"{path}: not an allowed checkpoint file; only safetensors and config JSON travel")
        sha = digests.get(path.name) or sha256_file(path)
        manifest[path.name] = [path.stat().st_size, sha]
        if sha in held:
            continue
        if is_weights_file(path.name):
            header, tensors = read_safetensors(path)
            table[path.name] = {"header": header.decode("utf-8"),
                                "tensors": {t.name: [t.dtype, list(t.shape)] for t in tensors}}
            arrays.update({f"{path.name}::{t.name}": to_array(t) for t in tensors})
        else:
            files[path.name] = path.read_bytes()
    if not any(SAFETENSORS_NAME.match(name) for name in manifest):
        raise WireError(f"{folder}: no safetensors weights to send")
    files[TENSOR_META_KEY] = json.dumps(table, sort_keys=True).encode()
    files[MANIFEST_KEY] = json.dumps(manifest, sort_keys=True).encode()
    return arrays, files


def read_manifest(files: Mapping[str, bytes]) -> list[tuple[str, int, str]]:
    """The upload's manifest: (file name, size, sha256) of every file of the checkpoint, carried or held."""
    from protocol.validation import is_allowed_file_name

    try:
        manifest = json.loads(files[MANIFEST_KEY])
        entries = [(str(name), int(size), str(sha)) for name, (size, sha) in sorted(manifest.items())]
    except (KeyError, ValueError, TypeError, AttributeError) as error:
        raise WireError(f"query.upload: the manifest {MANIFEST_KEY!r} is missing or not "
                        f"{{file: [size, sha256]}} ({type(error).__name__})") from None
    for name, size, sha in entries:
        if not is_allowed_file_name(name) or size < 0 or not SHA256_HEX.fullmatch(sha):
            raise WireError(f"query.upload: manifest entry {name!r}: an allowed file name, a size >= 0 and a "
                            "sha256 in hex are required")
    if not entries:
        raise WireError("query.upload: the manifest lists no files")
    return entries


def decode_checkpoint(arrays: dict[str, np.ndarray], files: dict[str, bytes], folder: Path) -> list[tuple[str, int, str]]:
    """Write the files encode_checkpoint carried into `folder` (every array must be in the tensor
    table, every carried file in the manifest); returns the manifest, held files included: the
    owner's own intake checks each carried file's size and sha256 against it, and fills the held
    ones from its store (or refuses with MISSING_FILE_DATA)."""
    from protocol.validation import is_allowed_file_name

    manifest = read_manifest(files)
    listed_files = {name for name, _, _ in manifest}
    try:
        table = json.loads(files[TENSOR_META_KEY])
    except (KeyError, ValueError) as error:
        raise WireError(f"query.upload: the tensor table {TENSOR_META_KEY!r} is missing or not JSON "
                        f"({error})") from None
    folder = Path(folder)
    listed = set()
    for file_name, entry in sorted(table.items()):
        if not is_weights_file(file_name) or file_name not in listed_files:
            raise WireError(f"query.upload: {file_name!r} is not an allowed weights file name of the manifest")
        tensors = []
        for name, (dtype, shape) in sorted(entry["tensors"].items()):
            key = f"{file_name}::{name}"
            if key not in arrays:
                raise WireError(f"query.upload: tensor {key!r} is in the table but not in the arrays")
            listed.add(key)
            tensors.append(from_array(name, dtype, shape, arrays[key]))
        write_safetensors(folder / file_name, str(entry["header"]).encode("utf-8"), tensors)
    extra = sorted(set(arrays) - listed)
    if extra:
        raise WireError(f"query.upload: arrays not in the tensor table: {', '.join(extra[:5])}")
    for name, data in files.items():
        if name in (TENSOR_META_KEY, MANIFEST_KEY):
            continue
        if not is_allowed_file_name(name) or is_weights_file(name) or name not in listed_files:
            raise WireError(f"query.upload: {name!r} is not an allowed config file name of the manifest")
        (folder / name).write_bytes(data)
    return manifest
