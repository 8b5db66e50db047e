"""What a Flower message between the trainer's ServerApp and an owner's shim may carry.

Both sides use this one schema (trainer_node/federation sends, flower_shim/ forwards), so the
shim can refuse anything else: a message is one public RPC of target_feedback.v1, named by its
action (`query.<action>`), with exactly the records listed here. There is no record for
per-example data because no public RPC returns any.

Candidates travel as an ArrayRecord of their tensors (Flower's array type is numpy's, which has
no bfloat16: a BF16 tensor goes as its uint16 bit pattern and the safetensors dtype is recorded
beside it, so the conversion is explicit and exact) and their config JSON files as bytes. The
small safetensors codec below needs no torch: a safetensors file is an 8-byte header length, a
JSON header and the raw little-endian tensor bytes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ACTIONS = ("info", "budget", "upload", "evaluate")
MESSAGE_CATEGORY = "query"  # Flower message types are "<category>.<action>"

# action -> {record name: record kind}; a message with any other record is refused.
REQUEST_RECORDS: dict[str, dict[str, str]] = {
    "info": {},
    "budget": {},
    "upload": {"tensors": "array", "files": "config"},
    "evaluate": {"request": "config"},
}
TENSOR_META_KEY = "__tensors__"   # in "files": JSON {weights file: {"metadata", "tensors": {name: [dtype, shape]}}}
EVALUATE_REQUEST_KEY = "evaluate_request"  # in "request": a serialized EvaluateRequest
REPLY_RECORD = "reply"            # ConfigRecord: "response" (serialized reply) or "checkpoint_id"
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


def read_safetensors(path: Path) -> tuple[dict[str, str] | None, list[Tensor]]:
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise WireError(f"{path}: not a safetensors file (shorter than its header length)")
    (size,) = struct.unpack("<Q", raw[:8])
    try:
        header = json.loads(raw[8:8 + size])
    except ValueError as error:
        raise WireError(f"{path}: safetensors header is not JSON ({error})") from None
    metadata = header.pop("__metadata__", None)
    body = raw[8 + size:]
    tensors = []
    for name, spec in sorted(header.items()):
        begin, end = spec["data_offsets"]
        tensors.append(Tensor(name, spec["dtype"], tuple(spec["shape"]), body[begin:end]))
    return metadata, tensors


def write_safetensors(path: Path, metadata: dict[str, str] | None, tensors: list[Tensor]) -> None:
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for tensor in tensors:
        header[tensor.name] = {"dtype": tensor.dtype, "shape": list(tensor.shape),
                               "data_offsets": [offset, offset + len(tensor.data)]}
        offset += len(tensor.data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format aligns the body to 8 bytes
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(encoded)) + encoded)
        for tensor in tensors:
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

        bad = sorted(config_keys.get("files", set()) - set(ALLOWED_JSON_FILES) - {TENSOR_META_KEY})
        if bad:
            raise WireError(f"query.upload: record 'files' has keys that are not allowlisted config files: "
                            f"{', '.join(bad)}")


def encode_checkpoint(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, bytes]]:
    """A checkpoint folder as (arrays keyed "<weights file>::<tensor>", config files by name plus
    the tensor table under TENSOR_META_KEY). Only allowlisted names travel."""
    from protocol.validation import SAFETENSORS_NAME, is_allowed_file_name

    arrays: dict[str, np.ndarray] = {}
    files: dict[str, bytes] = {}
    table: dict[str, Any] = {}
    for path in sorted(Path(folder).iterdir()):
        if not path.is_file():
            continue
        if not is_allowed_file_name(path.name):
            raise WireError(f"{path}: not an allowed checkpoint file; only safetensors and config JSON travel")
        if SAFETENSORS_NAME.match(path.name):
            metadata, tensors = read_safetensors(path)
            table[path.name] = {"metadata": metadata,
                                "tensors": {t.name: [t.dtype, list(t.shape)] for t in tensors}}
            arrays.update({f"{path.name}::{t.name}": to_array(t) for t in tensors})
        else:
            files[path.name] = path.read_bytes()
    if not table:
        raise WireError(f"{folder}: no safetensors weights to send")
    files[TENSOR_META_KEY] = json.dumps(table, sort_keys=True).encode()
    return arrays, files


def decode_checkpoint(arrays: dict[str, np.ndarray], files: dict[str, bytes], folder: Path) -> None:
    """Write what encode_checkpoint sent into `folder`; every array must be in the tensor table."""
    from protocol.validation import SAFETENSORS_NAME, is_allowed_file_name

    try:
        table = json.loads(files[TENSOR_META_KEY])
    except (KeyError, ValueError) as error:
        raise WireError(f"query.upload: the tensor table {TENSOR_META_KEY!r} is missing or not JSON "
                        f"({error})") from None
    folder = Path(folder)
    listed = set()
    for file_name, entry in sorted(table.items()):
        if not SAFETENSORS_NAME.match(file_name):
            raise WireError(f"query.upload: {file_name!r} is not an allowed weights file name")
        tensors = []
        for name, (dtype, shape) in sorted(entry["tensors"].items()):
            key = f"{file_name}::{name}"
            if key not in arrays:
                raise WireError(f"query.upload: tensor {key!r} is in the table but not in the arrays")
            listed.add(key)
            tensors.append(from_array(name, dtype, shape, arrays[key]))
        write_safetensors(folder / file_name, entry.get("metadata"), tensors)
    extra = sorted(set(arrays) - listed)
    if extra:
        raise WireError(f"query.upload: arrays not in the tensor table: {', '.join(extra[:5])}")
    for name, data in files.items():
        if name == TENSOR_META_KEY:
            continue
        if not is_allowed_file_name(name) or SAFETENSORS_NAME.match(name):
            raise WireError(f"query.upload: {name!r} is not an allowed config file name")
        (folder / name).write_bytes(data)
