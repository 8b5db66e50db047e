"""A LoRA run's checkpoints: the base folder, written ONCE, plus an adapter per candidate.

A LoRA run (trainer_node/lora.py) never changes its base weights, so every checkpoint it sends
(the base of a query, each lookahead candidate, a checkpoint-selection or final release) is
the same base folder beside a different adapter:
    config.json, generation_config.json, tokenizer files, model.safetensors   the base (once)
    adapter_config.json        the owner's allowed keys only (protocol.adapter_rules)
    adapter_model.safetensors  base_model.model.<module>.lora_A.weight / .lora_B.weight
The owner stores files by content (sha256), so after the first upload of a run only the adapter
travels (and adapter_config.json once: it is the same for every candidate); the owner validates
the adapter against the base it sits beside and applies it in memory (target_owner_node/worker.py).

`AdapterCandidateWriter` has CandidateWriter's interface (write / discard / prune_blobs) and
shares its blob store and links (trainer_node/feedback/candidates.py): `candidate_writer` picks
one for a model. Every file's sha256 is computed once, from the bytes as they are written. The
adapter tensors are named by PEFT itself (get_peft_model_state_dict), the names its
save_pretrained writes, so a checkpoint's adapter/ folder also loads with PeftModel.from_pretrained.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from protocol.adapter_rules import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from trainer_node.feedback.candidates import (
    WrittenCheckpoint,
    fresh_folders,
    link_file,
    start_checkpoint,
    store_blob,
)

ADAPTER_METADATA = {"format": "pt"}  # what PEFT's save_pretrained writes


def adapter_bytes(model: Any, state: Mapping[str, torch.Tensor] | None = None) -> bytes:
    """adapter_model.safetensors of `state` (a full state dict of the wrapped model) or the live model."""
    from safetensors.torch import save

    from trainer_node.lora import adapter_tensors

    return save(adapter_tensors(model, dict(state) if state is not None else None), metadata=ADAPTER_METADATA)


def write_adapter_folder(model: Any, directory: Path, state: Mapping[str, torch.Tensor] | None = None) -> Path:
    """adapter_config.json + adapter_model.safetensors in `directory` (a checkpoint's adapter/)."""
    from trainer_node.lora import adapter_config_bytes, lora_settings_of

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ADAPTER_CONFIG_FILE).write_bytes(adapter_config_bytes(lora_settings_of(model)))
    (directory / ADAPTER_WEIGHTS_FILE).write_bytes(adapter_bytes(model, state))
    return directory


class AdapterCandidateWriter:
    """Writes a LoRA model's parameter sets as base folder + adapter (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, workdir: Path):
        from rlvr_core.models.loading import save_policy
        from trainer_node.lora import adapter_config_bytes, base_model_and_state, lora_settings_of

        self.model = model
        self.workdir = Path(workdir)
        self.blobs, self.static = fresh_folders(self.workdir)
        base, state = base_model_and_state(model)
        save_policy(base, tokenizer, self.static, state_dict=state)  # the base, once per run
        (self.static / ADAPTER_CONFIG_FILE).write_bytes(adapter_config_bytes(lora_settings_of(model)))
        self._static_files = {}
        for path in sorted(self.static.iterdir()):
            self._static_files[path.name] = (_file_sha256(path), path.stat().st_size)
        self.base_bytes = sum(size for name, (_, size) in self._static_files.items() if name != ADAPTER_CONFIG_FILE)

    def write(self, state: Mapping[str, torch.Tensor], label: str) -> WrittenCheckpoint:
        """A checkpoint folder `label`: the base files (links) and the adapter of `state`."""
        out = self.workdir / label
        digests, sizes = start_checkpoint(out, (
            (name, self.static / name, digest, size) for name, (digest, size) in self._static_files.items()))
        digest, size = store_blob(self.blobs, adapter_bytes(self.model, state))
        link_file(self.blobs / digest, out / ADAPTER_WEIGHTS_FILE)
        digests[ADAPTER_WEIGHTS_FILE], sizes[ADAPTER_WEIGHTS_FILE] = digest, size
        return WrittenCheckpoint(out, digests, sizes)

    def discard(self, written: WrittenCheckpoint) -> None:
        shutil.rmtree(written.directory, ignore_errors=True)

    def prune_blobs(self, keep: set[str]) -> None:
        for blob in self.blobs.iterdir():
            if blob.name not in keep:
                blob.unlink(missing_ok=True)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
