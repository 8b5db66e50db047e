"""The tiny policy's spec: a typed config (`[model.tiny_spec]` of a trainer run config).

Kept apart from tiny_policy.py (which imports torch and transformers) so the trainer's config
edge can type `model.tiny_spec` without importing them: a typo such as `hiden_size` fails at
config load, naming `model.tiny_spec.hiden_size`. tiny_policy.py re-exports it.

A pydantic dataclass, so `dataclasses.replace` / `asdict` keep working (the build cache key
is a hash over `asdict(spec)`: ints given for float fields are widened, so 2 and 2.0 give one key).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from pydantic.dataclasses import dataclass


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class TinyPolicySpec:
    """Shape and warm-up recipe of a tiny policy.

    Defaults (measured on the `default` testbed's 3,200 source pairs): 1.12M parameters, built
    in ~145 s of single-thread CPU time; greedy exact match afterwards is ~65-70% on 1-digit
    add, ~30-38% on 2-digit add, ~10-18% on the held-out target test split (seeds 1 and 0),
    0% on spelling: clearly better than random, far from solved, room left for GRPO.
    """

    architecture: Literal["qwen2", "llama"] = Field(
        default="qwen2", description="Model family: qwen2 or llama."
    )
    vocab_size: int = Field(
        default=1024, strict=True, description="Upper bound of the BPE vocabulary (at least 258: bytes + "
        "specials); BPE may stop earlier on small corpora."
    )
    hidden_size: int = Field(
        default=128, strict=True, ge=1, description="Width; splits into num_heads heads of even size (RoPE)."
    )
    num_layers: int = Field(default=4, strict=True, ge=1, description="Transformer layers.")
    num_heads: int = Field(default=4, strict=True, ge=1, description="Attention heads.")
    num_kv_heads: int = Field(
        default=2, strict=True, ge=1, description="Key/value heads (grouped-query attention, as in Qwen2); "
        "divides num_heads."
    )
    intermediate_size: int = Field(default=512, strict=True, ge=1, description="MLP width (4 x hidden).")
    max_position: int = Field(
        default=256, strict=True, ge=1, description="Context length: prompt + completion tokens."
    )
    rope_theta: float = Field(default=10000.0, strict=True, gt=0, description="RoPE base.")
    sft_steps: int = Field(
        default=900, strict=True, ge=0, description="Supervised warm-up steps on the source pairs (0 = none)."
    )
    sft_batch_size: int = Field(default=32, strict=True, ge=1, description="Warm-up batch size.")
    sft_lr: float = Field(default=2e-3, strict=True, gt=0, description="Warm-up learning rate.")
    seed: int = Field(
        default=0, strict=True, description="Seed of the tokenizer, the initial weights and the warm-up."
    )

    @field_validator("vocab_size")
    @classmethod
    def _room_for_bytes(cls, value: int) -> int:
        from rlvr_core.models.tokenizer import MIN_VOCAB_SIZE  # imports tokenizers: only when validating

        if value < MIN_VOCAB_SIZE:
            raise ValueError(f"must be >= {MIN_VOCAB_SIZE} (256 bytes + specials), got {value}")
        return value

    @field_validator("num_heads")
    @classmethod
    def _even_heads(cls, value: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden_size")
        if hidden is not None and (hidden % value or (hidden // value) % 2):
            raise ValueError(f"hidden_size ({hidden}) must split into num_heads heads of even size (RoPE), "
                             f"got num_heads = {value}")
        return value

    @field_validator("num_kv_heads")
    @classmethod
    def _divides_heads(cls, value: int, info: ValidationInfo) -> int:
        heads = info.data.get("num_heads")
        if heads is not None and heads % value:
            raise ValueError(f"must divide num_heads ({heads}), got {value}")
        return value
