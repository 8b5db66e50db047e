"""What a LoRA adapter beside a checkpoint may contain (issue 14: candidates as adapters).

A LoRA candidate is a whole checkpoint folder (config.json, tokenizer, the base weights) plus
two files: adapter_config.json and adapter_model.safetensors. The base files are the ones the
owner already holds (content addressing), so only the adapter travels; the owner applies it in
memory with its own code (target_owner_node/worker.py): out = W x + scale * B (A x), scale =
lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). PEFT is never run on the owner.

Everything an evaluation could trip on is checked here, at upload, from the files alone:
- adapter_config.json holds only the keys below, with LoRA-only values (no DoRA, no bias
  training, no fan-in-fan-out layout, no modules saved in full, no per-layer rank patterns);
- adapter_model.safetensors is a valid safetensors file whose every tensor is named
  `base_model.model.<module>.lora_A.weight` or `...lora_B.weight`, where `<module>.weight` is a
  2-D weight of the base (not its input embedding: only linear layers take adapters), the
  module's last name is in target_modules, A is (r, in), B is (out, r), both exist, and the
  dtype is a float the model can run (F32, BF16, F16);
- the architecture is one whose 2-D weights outside the embedding are all nn.Linear (GPT-2's
  Conv1D layers store theirs transposed, so its adapters are refused);
- r is at most MAX_LORA_RANK and the file at most the server's adapter byte limit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol import errors
from protocol.refusal import CheckpointValidationError, is_int, shown

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE)
MAX_LORA_RANK = 256
DEFAULT_MAX_ADAPTER_BYTES = 1 << 30  # 1 GiB; a server may advertise less (GetInfo delta_support)
ADAPTER_ARCHITECTURES = frozenset({"Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"})
ADAPTER_DTYPES = frozenset({"F32", "BF16", "F16"})

# key -> (required, check(value) -> problem or None)
_CONFIG_KEYS: dict[str, tuple[bool, Any]] = {
    "peft_type": (True, lambda v: None if v == "LORA" else "must be \"LORA\""),
    "r": (True, lambda v: None if is_int(v) and 1 <= v <= MAX_LORA_RANK else f"must be an int in [1, {MAX_LORA_RANK}]"),
    "lora_alpha": (True, lambda v: None if _positive_number(v) else "must be a positive finite number"),
    "target_modules": (True, lambda v: None if _module_names(v) else "must be a non-empty list of module names"),
    "use_rslora": (False, lambda v: None if isinstance(v, bool) else "must be true or false"),
    "bias": (False, lambda v: None if v == "none" else "must be \"none\" (biases are not trained)"),
    "task_type": (False, lambda v: None if v in (None, "CAUSAL_LM") else "must be \"CAUSAL_LM\""),
    "lora_dropout": (False, lambda v: None if _non_negative_number(v) else "must be a number >= 0"),
    "fan_in_fan_out": (False, lambda v: None if v is False else "must be false (weights as nn.Linear stores them)"),
    "use_dora": (False, lambda v: None if v is False else "must be false (DoRA is not applied by this owner)"),
    "inference_mode": (False, lambda v: None if isinstance(v, bool) else "must be true or false"),
}
_TENSOR = re.compile(r"^base_model\.model\.(?P<module>[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)\.lora_(?P<part>A|B)\.weight$")


def _positive_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _non_negative_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _module_names(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_]+", v) for v in value))


def _refuse(message: str, reason: str = errors.INVALID_CHECKPOINT) -> CheckpointValidationError:
    return CheckpointValidationError(reason, message)


@dataclass(frozen=True)
class LoraModule:
    module: str  # e.g. "model.layers.0.self_attn.q_proj"
    in_features: int
    out_features: int


@dataclass(frozen=True)
class ValidatedAdapter:
    rank: int
    alpha: float
    use_rslora: bool
    modules: tuple[LoraModule, ...]

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def parse_adapter_config(data: bytes) -> dict[str, Any]:
    from protocol.validation import _json_object  # size limit, duplicate keys, a JSON object

    config = _json_object(data, ADAPTER_CONFIG_FILE)
    for key in config:
        if key not in _CONFIG_KEYS:
            raise _refuse(f"{ADAPTER_CONFIG_FILE}: key {shown(key)} is not allowed; allowed: "
                          f"{', '.join(sorted(_CONFIG_KEYS))}")
    for key, (required, check) in _CONFIG_KEYS.items():
        if key not in config:
            if required:
                raise _refuse(f"{ADAPTER_CONFIG_FILE}: {key!r} is required")
            continue
        problem = check(config[key])
        if problem is not None:
            raise _refuse(f"{ADAPTER_CONFIG_FILE}: {key!r} {problem}")
    return config


def validate_adapter(
    config_bytes: bytes,
    weights_path: Path,
    architecture: str,
    base_shapes: dict[str, tuple[int, ...]],
    embedding_tensor: str,
    max_adapter_bytes: int = DEFAULT_MAX_ADAPTER_BYTES,
) -> ValidatedAdapter:
    """Check an adapter against the base checkpoint it sits beside (see the module docstring)."""
    from protocol.validation import validate_safetensors

    if architecture not in ADAPTER_ARCHITECTURES:
        raise _refuse(f"LoRA adapters are accepted for {', '.join(sorted(ADAPTER_ARCHITECTURES))}; "
                      f"this checkpoint is {architecture}")
    config = parse_adapter_config(config_bytes)
    size = Path(weights_path).stat().st_size
    if size > max_adapter_bytes:
        raise _refuse(f"{ADAPTER_WEIGHTS_FILE}: {size} bytes, over this server's adapter limit of "
                      f"{max_adapter_bytes}", errors.UPLOAD_TOO_LARGE)
    summary = validate_safetensors(weights_path)
    bad_dtypes = sorted(summary.dtypes - ADAPTER_DTYPES)
    if bad_dtypes:
        raise _refuse(f"{ADAPTER_WEIGHTS_FILE}: dtype {bad_dtypes[0]} is not allowed; use F32, BF16 or F16")
    rank, targets = int(config["r"]), set(config["target_modules"])
    parts: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, shape in summary.shapes.items():
        match = _TENSOR.match(name)
        if match is None:
            raise _refuse(f"{ADAPTER_WEIGHTS_FILE}: tensor {shown(name)} is not a LoRA weight "
                          "(base_model.model.<module>.lora_A.weight or .lora_B.weight)")
        parts.setdefault(match["module"], {})[match["part"]] = shape
    if not parts:
        raise _refuse(f"{ADAPTER_WEIGHTS_FILE}: holds no LoRA weights")
    modules = []
    for module, pair in sorted(parts.items()):
        base = base_shapes.get(f"{module}.weight")
        if base is None or len(base) != 2 or f"{module}.weight" == embedding_tensor:
            raise _refuse(f"{ADAPTER_WEIGHTS_FILE}: module {shown(module)} is not a linear layer of the base "
                          "checkpoint (its 2-D weight <module>.weight, not the input embedding)")
        if module.rsplit(".", 1)[-1] not in targets:
            raise _refuse(f"{ADAPTER_WEIGHTS_FILE}: module {shown(module)} is not in target_modules")
        if set(pair) != {"A", "B"}:
            raise _refuse(f"{ADAPTER_WEIGHTS_FILE}: module {shown(module)} needs both lora_A and lora_B")
        out_features, in_features = base
        if tuple(pair["A"]) != (rank, in_features) or tuple(pair["B"]) != (out_features, rank):
            raise _refuse(f"{ADAPTER_WEIGHTS_FILE}: module {shown(module)}: lora_A must be {[rank, in_features]} and "
                          f"lora_B {[out_features, rank]} (r = {rank}), got {list(pair['A'])} and {list(pair['B'])}")
        modules.append(LoraModule(module, in_features, out_features))
    return ValidatedAdapter(rank, float(config["lora_alpha"]), bool(config.get("use_rslora", False)), tuple(modules))
