"""LoRA training: `[model.lora]`, the PEFT wrap of the policy, and what a LoRA run's files hold.

With `[model.lora]` the loaded policy is wrapped by PEFT (`get_peft_model` with a `LoraConfig`)
before anything else sees it: the engine generates with the adapter on, the GRPO trainer's
optimizer holds only the adapter's parameters (PEFT freezes the base), and the lookahead steps
only them (grpo/lookahead.py skips frozen parameters). What a LoRA run sends the owner is the
base folder once and then only adapters (trainer_node/feedback/adapters.py); what it checkpoints
is the adapter and a merged plain folder (trainer_node/grpo/checkpoint.py).

Values the owner would refuse are refused at config load, by the owner's own rule
(protocol.adapter_rules.parse_adapter_config), naming the `model.lora.<field>`:
- r in [1, MAX_LORA_RANK], alpha > 0, target_modules plain module names (q_proj, ...);
- dropout must be 0: the trainer keeps the model in eval mode (the loss's logprobs are those of
  the distribution that generated the rollouts: grpo/trainer.py), so a dropout would never run;
- biases are not trained, no DoRA, no modules saved in full (the owner applies none of them).
At model setup (`apply_lora`): an architecture the owner applies adapters to
(ADAPTER_ARCHITECTURES: GPT-2's Conv1D layers are refused) and target modules that are linear
layers of the model.

The adapter trains and travels in the model's dtype (`autocast_adapter_dtype=False`), as full-
parameter training does: a bf16 model sends bf16 adapters. This module imports peft only on use
(the `lora` extra), so the config edge stays light.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from protocol.adapter_rules import ADAPTER_ARCHITECTURES, MAX_LORA_RANK
from rlvr_core.configuration import ConfigError, Section

ADAPTER_NAME = "default"  # PEFT's name for the one adapter; stripped from the saved tensor names
INSTALL_HINT = "pip install -e '.[lora]' (peft)"

# model.lora field -> adapter_config.json key (the owner's names)
_CONFIG_KEY = {"r": "r", "alpha": "lora_alpha", "target_modules": "target_modules", "dropout": "lora_dropout",
               "use_rslora": "use_rslora"}


class LoraSettings(Section):
    """`[model.lora]`: train a LoRA adapter (PEFT) instead of every parameter; candidates are adapters."""

    r: int = Field(default=16, strict=True, ge=1, le=MAX_LORA_RANK,
                   description=f"Adapter rank (1 to {MAX_LORA_RANK}, the owner's limit).")
    alpha: float = Field(default=32.0, gt=0, allow_inf_nan=False,
                         description="lora_alpha: the update is scaled by alpha / r (alpha / sqrt(r) with use_rslora).")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="Last names of the linear layers that take an adapter (Qwen2/Llama: q_proj, k_proj, v_proj, "
        "o_proj, gate_proj, up_proj, down_proj). Never the embedding or lm_head.",
    )
    dropout: float = Field(
        default=0.0, description="lora_dropout; must be 0: the trainer keeps the model in eval mode "
        "(logprobs of the rollouts' own distribution), where a dropout never runs.",
    )
    use_rslora: bool = Field(default=False, description="Rank-stabilised scaling alpha / sqrt(r).")

    @field_validator("target_modules")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not re.fullmatch(r"[A-Za-z0-9_]+", name)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a module name (letters, digits, _: the last name of a layer, "
                             "e.g. q_proj)")
        if len(set(value)) != len(value):
            raise ValueError(f"lists a module twice: {value}")
        if any(name in ("lm_head", "embed_tokens") for name in value):
            raise ValueError("the embedding and the output head take no adapter (the owner applies adapters "
                             "to linear layers only); list e.g. q_proj, v_proj")
        return value

    @field_validator("dropout")
    @classmethod
    def _no_dropout(cls, value: float) -> float:
        if value != 0:
            raise ValueError(f"must be 0, got {value}: the trainer keeps the model in eval mode (the loss's logprobs "
                             "are those of the distribution that generated the rollouts), so a dropout would never run")
        return value

    @model_validator(mode="after")
    def _owner_accepts(self) -> LoraSettings:
        """The owner's own rule on the adapter_config.json this section writes: what it refuses fails here."""
        from protocol.adapter_rules import parse_adapter_config
        from protocol.refusal import CheckpointValidationError

        config = adapter_config(self)
        try:
            parse_adapter_config(json.dumps(config).encode())
        except CheckpointValidationError as error:
            field = next((f for f, key in _CONFIG_KEY.items() if repr(key) in str(error)), "target_modules")
            raise ValueError(f"{field}: the target owner would refuse this adapter ({error})") from None
        return self


def adapter_config(settings: LoraSettings) -> dict[str, Any]:
    """adapter_config.json as the owner accepts it (protocol.adapter_rules: these keys only)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": settings.r,
        "lora_alpha": settings.alpha,
        "target_modules": sorted(settings.target_modules),
        "lora_dropout": settings.dropout,
        "use_rslora": settings.use_rslora,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_dora": False,
    }


def adapter_config_bytes(settings: LoraSettings) -> bytes:
    return (json.dumps(adapter_config(settings), indent=1, sort_keys=True) + "\n").encode()


# --- the model ------------------------------------------------------------------------------

def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError(f"model.lora: LoRA training needs PEFT, which is not installed; {INSTALL_HINT}") from None
    return peft


def apply_lora(model: Any, settings: LoraSettings) -> Any:
    """The policy wrapped by PEFT with one LoRA adapter; only the adapter's parameters require grad.

    ConfigError naming model.lora when the owner could not apply the adapter to this model."""
    import torch

    peft = _peft()
    architecture = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
    if architecture not in ADAPTER_ARCHITECTURES:
        raise ConfigError(f"model.lora: the target owner applies LoRA adapters to {', '.join(sorted(ADAPTER_ARCHITECTURES))} "
                          f"models only; this model is {architecture}. Remove [model.lora] to train every parameter")
    embedding = model.get_input_embeddings()
    found: dict[str, list[Any]] = {name: [] for name in settings.target_modules}
    for qualified, module in model.named_modules():
        last = qualified.rsplit(".", 1)[-1]
        if last in found:
            found[last].append(module)
    for name, modules in found.items():
        if not modules:
            raise ConfigError(f"model.lora.target_modules: this model has no module named {name!r}; its linear layers "
                              f"are {', '.join(_linear_names(model))}")
        if any(not isinstance(m, torch.nn.Linear) or m is embedding for m in modules):
            raise ConfigError(f"model.lora.target_modules: {name!r} is not a linear layer (nn.Linear) of this model; "
                              f"the owner applies adapters to linear layers only: {', '.join(_linear_names(model))}")
    config = peft.LoraConfig(
        r=settings.r, lora_alpha=settings.alpha, target_modules=list(settings.target_modules),
        lora_dropout=settings.dropout, use_rslora=settings.use_rslora, bias="none", task_type="CAUSAL_LM",
    )
    wrapped = peft.get_peft_model(model, config, adapter_name=ADAPTER_NAME, autocast_adapter_dtype=False)
    wrapped.eval()
    return wrapped


def _linear_names(model: Any) -> list[str]:
    import torch

    embedding = model.get_input_embeddings()
    names = {q.rsplit(".", 1)[-1] for q, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not embedding}
    return sorted(names - {"lm_head"})


def is_lora_model(model: Any) -> bool:
    """True for a model `apply_lora` wrapped (False, without importing anything, when PEFT is absent)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def lora_settings_of(model: Any) -> LoraSettings:
    """The LoraSettings a wrapped model was built with (its PEFT config, read back)."""
    config = model.peft_config[ADAPTER_NAME]
    return LoraSettings(r=config.r, alpha=float(config.lora_alpha), target_modules=sorted(config.target_modules),
                        dropout=float(config.lora_dropout), use_rslora=bool(config.use_rslora))


def adapter_tensors(model: Any, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The adapter's tensors as adapter_model.safetensors names them, from `state` (a full state
    dict of the wrapped model, e.g. a lookahead candidate) or the live model: PEFT's own naming,
    `base_model.model.<module>.lora_A.weight` / `.lora_B.weight` (the adapter name stripped)."""
    from peft import get_peft_model_state_dict

    tensors = get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER_NAME)
    return {name: tensor.detach().contiguous() for name, tensor in tensors.items()}


def base_model_and_state(model: Any) -> tuple[Any, dict[str, Any]]:
    """The wrapped transformers model and its base weights under their plain names (no copy): what
    save_policy writes as the base folder a LoRA run's adapters sit beside."""
    base = model.get_base_model()
    state = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        state[name.replace(".base_layer.", ".")] = tensor
    return base, state


def merged_copy(model: Any) -> Any:
    """A plain transformers model with the adapter merged in (a copy: the live model is untouched)."""
    merged = copy.deepcopy(model).merge_and_unload()
    merged.eval()
    return merged


def load_adapter_tensors(model: Any, tensors: dict[str, Any]) -> None:
    """Copy saved adapter tensors (adapter_tensors' names) into the live wrapped model.

    ValueError naming the first tensor that is missing, unexpected or of another shape."""
    import torch

    live = adapter_tensors(model)
    unexpected = sorted(set(tensors) - set(live))
    missing = sorted(set(live) - set(tensors))
    if unexpected or missing:
        raise ValueError(f"the adapter does not match this run's [model.lora]: "
                         f"{'unexpected ' + unexpected[0] if unexpected else 'missing ' + missing[0]}")
    params = dict(model.named_parameters())
    for name, tensor in tensors.items():  # every check before the first copy: a refusal changes nothing
        target = params[_live_name(name)]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"adapter tensor {name} has shape {tuple(tensor.shape)}, this run's is "
                             f"{tuple(target.shape)}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            target = params[_live_name(name)]
            target.copy_(tensor.to(target.dtype))


def _live_name(saved: str) -> str:
    """base_model.model.X.lora_A.weight -> base_model.model.X.lora_A.default.weight (the parameter)."""
    head, part, tail = saved.rpartition(".lora_")
    kind, _, rest = tail.partition(".")
    return f"{head}{part}{kind}.{ADAPTER_NAME}.{rest}"
