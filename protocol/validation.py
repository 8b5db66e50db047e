"""What a checkpoint may contain. Both parties agree on these lists: the trainer only
uploads these files and the owner refuses anything else (INVALID_ARGUMENT, nothing stored).

Weights are safetensors only: they cannot execute code. Pickle-based formats (.bin, .pt,
.pth, .pkl, .ckpt) are never accepted, and trust_remote_code is never enabled.
"""

from __future__ import annotations

import re

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


def is_allowed_file_name(name: str) -> bool:
    return name in ALLOWED_JSON_FILES or bool(SAFETENSORS_NAME.match(name))
