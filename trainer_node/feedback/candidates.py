"""Parameter sets -> checkpoint folders that cost the owner only the tensors that changed.

Layout chosen (no proto change): ONE SAFETENSORS SHARD PER TENSOR, named and indexed as
transformers shards a checkpoint (model-NNNNN-of-NNNNN.safetensors + model.safetensors.index.json),
which every v1 owner accepts. The owner stores files by content (sha256) and the client sends
only files the owner does not hold, so a candidate that changes k of T tensors sends about
k/T of the weight bytes; the JSON files and the index are identical for every candidate of a
run and never travel twice. Full-parameter lookahead candidates change every tensor (a dense
delta, sent losslessly at the model's own precision); a LoRA run's candidates change only the
adapter (trainer_node/feedback/adapters.py).

Under the writer's folder:
    static/          config.json, generation_config.json, tokenizer files (written once)
    blobs/<sha256>   one file per distinct shard content (written once, hard-linked after)
    <label>/         one checkpoint: hard links to static files and blobs, plus the index
Every file's sha256 is computed once, from the bytes in memory as they are written, and handed
to the uploader (`WrittenCheckpoint.digests`), so nothing is read back to be hashed. A tensor
that is the live model's own, unchanged since it was last written (a frozen weight), is not
even serialized again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

INDEX_FILE = "model.safetensors.index.json"
SHARD_METADATA = {"format": "pt"}  # what transformers writes; it reads shards without it too


def shard_name(position: int, total: int) -> str:
    return f"model-{position + 1:05d}-of-{total:05d}.safetensors"


@dataclass(frozen=True)
class WrittenCheckpoint:
    directory: Path
    digests: dict[str, str]
    """sha256 (hex) of every file in `directory`, by file name."""
    sizes: dict[str, int]

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())


def candidate_writer(model: torch.nn.Module, tokenizer: Any, workdir: Path) -> Any:
    """The writer of this model's candidates: base + adapters for a LoRA model
    (trainer_node/feedback/adapters.py), one shard per tensor otherwise."""
    from trainer_node.lora import is_lora_model

    if is_lora_model(model):
        from trainer_node.feedback.adapters import AdapterCandidateWriter

        return AdapterCandidateWriter(model, tokenizer, workdir)
    return CandidateWriter(model, tokenizer, workdir)


def fresh_folders(workdir: Path) -> tuple[Path, Path]:
    """Empty `blobs/` and `static/` under `workdir` (a writer never reuses an earlier run's files)."""
    blobs, static = workdir / "blobs", workdir / "static"
    for folder in (blobs, static):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
    return blobs, static


class CandidateWriter:
    """Writes parameter sets of one model as per-tensor-shard checkpoints (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, workdir: Path):
        self.model = model
        self.workdir = Path(workdir)
        self.blobs, self.static = fresh_folders(self.workdir)
        # a plain string for the per-tensor loops of the background thread, where every line of
        # Python holds the GIL the training thread needs
        self._blob_dir = str(self.blobs)
        self.tensor_names, self.dtypes = self._write_static(model, tokenizer)
        live = self._live_tensors()
        self.total_size = sum(live[n].numel() * _element_size(self.dtypes[n]) for n in self.tensor_names)
        self._static_files = self._digest_static()
        # (shape, dtype, version) of a live tensor when last written -> (sha256, size) of its shard
        self._live_written: dict[str, tuple[tuple, str, int]] = {}

    # --- the files every candidate shares ----------------------------------------------

    def _write_static(self, model: torch.nn.Module, tokenizer: Any) -> tuple[list[str], dict[str, torch.dtype]]:
        """save_policy once (config, tokenizer and the transformers-checked files); keep the JSON
        files, and read from its weights header which tensors a checkpoint holds (tied weights
        are stored once) and in which dtype."""
        from safetensors import safe_open

        from rlvr_core.models.loading import save_policy

        template = self.workdir / "template"
        if template.exists():
            shutil.rmtree(template)
        save_policy(model, tokenizer, template)
        weights = sorted(template.glob("*.safetensors"))
        names: list[str] = []
        dtypes: dict[str, torch.dtype] = {}
        for file in weights:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                    names.append(name)
                    dtypes[name] = handle.get_slice(name).get_dtype()
        for entry in template.iterdir():
            if entry.suffix == ".json" and entry.name != INDEX_FILE:
                shutil.copyfile(entry, self.static / entry.name)
        shutil.rmtree(template)
        names.sort()
        return names, {name: _torch_dtype(dtypes[name]) for name in names}

    def _digest_static(self) -> dict[str, tuple[str, int]]:
        out = {}
        for path in sorted(self.static.iterdir()):
            data = path.read_bytes()
            out[path.name] = (hashlib.sha256(data).hexdigest(), len(data))
        index = self._index_bytes()
        out[INDEX_FILE] = self._store(index)
        (self.static / INDEX_FILE).unlink(missing_ok=True)
        return out

    def _index_bytes(self) -> bytes:
        total = len(self.tensor_names)
        weight_map = {name: shard_name(i, total) for i, name in enumerate(self.tensor_names)}
        index = {"metadata": {"total_size": self.total_size}, "weight_map": weight_map}
        return json.dumps(index, indent=1, sort_keys=True).encode()

    # --- writing ---------------------------------------------------------------------------

    def write(self, state: Mapping[str, torch.Tensor], label: str) -> WrittenCheckpoint:
        """A checkpoint folder `label` holding `state` (a full state dict of the model)."""
        missing = [name for name in self.tensor_names if name not in state]
        if missing:
            raise ValueError(f"the parameter set lacks {len(missing)} tensors of the model, e.g. {missing[0]!r}")
        out = self.workdir / label
        digests, sizes = start_checkpoint(out, (
            (name, self.blobs / digest if name == INDEX_FILE else self.static / name, digest, size)
            for name, (digest, size) in self._static_files.items()))
        live = self._live_tensors()
        total = len(self.tensor_names)
        folder = str(out)  # a string, as self._blob_dir
        for position, name in enumerate(self.tensor_names):
            file = shard_name(position, total)
            digest, size = self._shard(name, state[name], live.get(name))
            link_file(os.path.join(self._blob_dir, digest), os.path.join(folder, file))
            digests[file], sizes[file] = digest, size
        return WrittenCheckpoint(out, digests, sizes)

    def _live_tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.model.state_dict(keep_vars=True))

    def _shard(self, name: str, tensor: torch.Tensor, live: torch.Tensor | None) -> tuple[str, int]:
        """(sha256, size) of the one-tensor shard of `tensor`, written to blobs/ if new."""
        tensor = tensor.detach()
        is_live = live is not None and _same_storage(tensor, live)
        if is_live:
            known = self._live_written.get(name)
            stamp = (tuple(live.shape), str(live.dtype), int(live._version))
            if known is not None and known[0] == stamp:
                return known[1], known[2]
        digest, size = store_blob(self._blob_dir, *shard_parts(name, tensor.to(self.dtypes[name])))
        if is_live:
            self._live_written[name] = ((tuple(live.shape), str(live.dtype), int(live._version)), digest, size)
        return digest, size

    def _store(self, data: bytes) -> tuple[str, int]:
        return store_blob(self._blob_dir, data)

    def discard(self, written: WrittenCheckpoint) -> None:
        """Remove a checkpoint folder (its blobs stay: later candidates reuse them)."""
        shutil.rmtree(written.directory, ignore_errors=True)

    def prune_blobs(self, keep: set[str]) -> None:
        """Delete blobs whose digest is not in `keep` (bounded disk use over a long run)."""
        protected = {digest for digest, _ in self._static_files.values()} | keep
        protected |= {entry[1] for entry in self._live_written.values()}
        for blob in self.blobs.iterdir():
            if blob.name not in protected:
                blob.unlink(missing_ok=True)


def start_checkpoint(out: Path, files: Iterable[tuple[str, Path, str, int]]) -> tuple[dict[str, str], dict[str, int]]:
    """A fresh folder `out` holding links to `files` (name, source, sha256, size); returns the
    digests and sizes by name, which the writer completes with the checkpoint's own weights."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    digests: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for name, source, digest, size in files:
        link_file(source, out / name)
        digests[name], sizes[name] = digest, size
    return digests, sizes


def store_blob(blobs: Path | str, *parts: bytes | memoryview) -> tuple[str, int]:
    """(sha256, size) of the concatenated `parts`, written once to blobs/<sha256> (atomically;
    kept if already there). Hashing and writing a large buffer release the GIL, so a background
    writer holds it for microseconds per shard, not for a copy of the shard."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part)
    digest = hasher.hexdigest()
    blob = os.path.join(blobs, digest)
    if not os.path.exists(blob):
        tmp = blob + ".tmp"
        with open(tmp, "wb") as handle:
            for part in parts:
                handle.write(part)
        os.replace(tmp, blob)
    return digest, sum(memoryview(part).nbytes for part in parts)


def shard_parts(name: str, tensor: torch.Tensor) -> tuple[bytes, memoryview]:
    """A one-tensor safetensors file as (header, data): the bytes `safetensors.torch.save` writes
    for {name: tensor} with SHARD_METADATA, but with the data as a view of the tensor's own memory
    instead of a copy (tests/trainer_node/test_candidates.py checks the two are identical)."""
    tensor = tensor.detach().contiguous()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    data = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
    return shard_header(name, tensor.dtype, tuple(tensor.shape), data.nbytes), data


@functools.lru_cache(maxsize=4096)
def shard_header(name: str, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> bytes:
    """The length prefix and JSON header of a one-tensor safetensors file (the same for every
    candidate of a run, so it is built once per tensor)."""
    entry = {"dtype": _SAFETENSORS_NAMES[dtype], "shape": list(shape), "data_offsets": [0, nbytes]}
    header = json.dumps({"__metadata__": SHARD_METADATA, name: entry}, separators=(",", ":")).encode()
    header += b" " * (-(8 + len(header)) % 8)  # the data starts 8-byte aligned, as safetensors pads it
    return len(header).to_bytes(8, "little") + header


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()


def link_file(source: Path | str, target: Path | str) -> None:
    """A hard link (a copy where the file system has none): candidate folders share their files."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


_SAFETENSORS_NAMES = {dtype: name for name, dtype in _SAFETENSORS_DTYPES.items()}


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _torch_dtype(name: str) -> torch.dtype:
    if name not in _SAFETENSORS_DTYPES:
        raise ValueError(f"the model stores a tensor as {name}, which candidates cannot write")
    return _SAFETENSORS_DTYPES[name]
