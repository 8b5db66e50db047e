"""Checkpoint and resume a GRPO run without pickle.

A checkpoint directory holds
    model/                     save_policy output (config + *.safetensors + tokenizer); a LoRA run's
                               is the adapter MERGED into the base: a plain folder anyone (and the
                               owner, as a full checkpoint) can load and evaluate
    adapter/                   LoRA runs only (trainer_node/lora.py): adapter_config.json +
                               adapter_model.safetensors, the owner's adapter format, which
                               PeftModel.from_pretrained(base, "adapter") also loads; resume reads it
    optimizer.safetensors      every optimizer state tensor, keyed "state.<param>.<name>"
    rng.safetensors            torch CPU (and CUDA) generator states as uint8 tensors
    trainer_state.json         step, rollout count, optimizer param groups and scalar state,
                               policy.state_dict(), python `random` and numpy rng states, and
                               the update rules' state (SetGRPO's calibration windows)
It is written to a temporary sibling and renamed, so a crash never leaves half a checkpoint.
Resuming restores all of it, so k steps + resume + (N - k) steps equals N straight steps.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from protocol.adapter_rules import ADAPTER_WEIGHTS_FILE
from trainer_node.grpo.trainer import GRPOTrainer
from trainer_node.lora import is_lora_model

FORMAT_VERSION = 1
ADAPTER_DIR = "adapter"
STATE_FILE = "trainer_state.json"


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete, or does not match this run."""


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def save_checkpoint(trainer: GRPOTrainer, directory: Path, extra: dict[str, Any] | None = None) -> Path:
    """Write the full trainer state to `directory` atomically; returns the directory."""
    from rlvr_core.models.loading import save_policy

    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)

    if is_lora_model(trainer.model):
        from trainer_node.feedback.adapters import write_adapter_folder
        from trainer_node.lora import merged_copy

        save_policy(merged_copy(trainer.model), trainer.tokenizer, tmp / "model")
        write_adapter_folder(trainer.model, tmp / ADAPTER_DIR)
    else:
        save_policy(trainer.model, trainer.tokenizer, tmp / "model")
    opt_tensors, opt_json = _split_optimizer_state(trainer.optimizer.state_dict())
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    save_file(_torch_rng_tensors(), str(tmp / "rng.safetensors"))
    python_state = random.getstate()
    state = {
        "format_version": FORMAT_VERSION,
        "step": trainer.step_index,
        "rollouts_cumulative": trainer.rollouts_cumulative,
        "policy_name": trainer.policy.name,
        "policy_state": trainer.policy.state_dict(),
        "policy_rng": trainer.policy.rng.bit_generator.state,
        "update_rules": trainer.update_seams.state_dict(),
        "python_random": [python_state[0], list(python_state[1]), python_state[2]],
        "optimizer": opt_json,
        "extra": extra or {},
    }
    _write_json(tmp / STATE_FILE, state)

    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory


def load_checkpoint(trainer: GRPOTrainer, directory: Path) -> dict[str, Any]:
    """Restore a trainer built from the same config to the checkpointed state.

    Returns the checkpoint's `extra` dict. Raises CheckpointError (and changes nothing it has
    not validated) when the directory is not a checkpoint of a compatible run.
    """
    directory = Path(directory)
    state = _read_state(directory)
    if state["policy_name"] != trainer.policy.name:
        raise CheckpointError(
            f"checkpoint {directory} was written by data policy {state['policy_name']!r}, "
            f"this run uses {trainer.policy.name!r}"
        )
    rules_state = state.get("update_rules")  # absent from older checkpoints: the rules start afresh
    if rules_state is not None:
        try:
            trainer.update_seams.check_state(rules_state)
        except ValueError as error:
            raise CheckpointError(f"checkpoint {directory}: {error}") from None
    lora = is_lora_model(trainer.model)
    if lora != (directory / ADAPTER_DIR).is_dir():
        raise CheckpointError(
            f"checkpoint {directory} was written by a {'full-parameter' if lora else 'LoRA'} run and this run "
            f"{'trains a LoRA adapter' if lora else 'trains every parameter'}: resume with the same [model.lora]")
    if lora:
        adapter = load_file(str(directory / ADAPTER_DIR / ADAPTER_WEIGHTS_FILE))
    else:
        weights = _read_model_weights(directory / "model")
    opt_tensors = load_file(str(directory / "optimizer.safetensors"))
    rng = load_file(str(directory / "rng.safetensors"))

    if lora:
        from trainer_node.lora import load_adapter_tensors

        try:
            load_adapter_tensors(trainer.model, adapter)
        except ValueError as error:
            raise CheckpointError(f"checkpoint {directory}: {error}") from None
    else:
        _load_model_weights(trainer.model, weights, directory)
    trainer.optimizer.load_state_dict(_join_optimizer_state(opt_tensors, state["optimizer"]))
    trainer.policy.load_state_dict(state["policy_state"])
    trainer.policy.rng.bit_generator.state = state["policy_rng"]
    if rules_state is not None:
        trainer.update_seams.load_state_dict(rules_state)
    version, internal, gauss = state["python_random"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(rng["torch_cpu"])
    if torch.cuda.is_available():
        cuda = [rng[k] for k in sorted(rng) if k.startswith("torch_cuda.")]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
    trainer.step_index = int(state["step"])
    trainer.rollouts_cumulative = int(state["rollouts_cumulative"])
    trainer.engine.sync_weights()
    return dict(state.get("extra", {}))


def latest_checkpoint(run_or_checkpoint: Path) -> Path:
    """Accept a checkpoint dir or a run dir (picks its newest checkpoints/step_*)."""
    path = Path(run_or_checkpoint)
    if (path / STATE_FILE).is_file():
        return path
    candidates = sorted(p for p in (path / "checkpoints").glob("step_*") if (p / STATE_FILE).is_file())
    if not candidates:
        raise CheckpointError(f"{path} is neither a checkpoint nor a run directory with checkpoints/step_*")
    return candidates[-1]


# ----------------------------------------------------------------- helpers
def _write_json(path: Path, payload: dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())


def _read_state(directory: Path) -> dict[str, Any]:
    path = directory / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory} is not a checkpoint: {STATE_FILE} is missing")
    for name in ("optimizer.safetensors", "rng.safetensors", "model"):
        if not (directory / name).exists():
            raise CheckpointError(f"checkpoint {directory} is incomplete: {name} is missing")
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"checkpoint {path} is not valid JSON: {error}") from None
    if state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {directory} has format_version {state.get('format_version')!r}; this code reads {FORMAT_VERSION}"
        )
    return state


def _split_optimizer_state(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for param_id, entry in state_dict["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{param_id}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(param_id), {})[key] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def _join_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        _, param_id, key = name.split(".", 2)
        state.setdefault(int(param_id), {})[key] = tensor
    for param_id, entries in meta.get("scalars", {}).items():
        state.setdefault(int(param_id), {}).update(entries)
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else dict(g) for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def _torch_rng_tensors() -> dict[str, torch.Tensor]:
    out = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, st in enumerate(torch.cuda.get_rng_state_all()):
            out[f"torch_cuda.{i:03d}"] = st
    return out


def _read_model_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir} holds no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


def _load_model_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], directory: Path) -> None:
    """Copy saved weights into the live model; keys missing on disk must be tied duplicates."""
    live = model.state_dict(keep_vars=True)
    unexpected = sorted(set(weights) - set(live))
    if unexpected:
        raise CheckpointError(f"checkpoint {directory} has weights this model lacks: {unexpected[:5]}")
    loaded_ids = {id(live[k]) for k in weights}
    untied_missing = sorted(k for k in set(live) - set(weights) if id(live[k]) not in loaded_ids)
    if untied_missing:
        raise CheckpointError(f"checkpoint {directory} lacks weights for: {untied_missing[:5]}")
    for key, tensor in weights.items():
        if tuple(tensor.shape) != tuple(live[key].shape):
            raise CheckpointError(
                f"checkpoint {directory}: {key} has shape {tuple(tensor.shape)}, model has {tuple(live[key].shape)}"
            )
    with torch.no_grad():
        for key, tensor in weights.items():
            live[key].copy_(tensor.to(live[key].dtype))
