"""GPT-2 checkpoints whose next-token distribution is chosen by the suite and is the same at
every position, whatever the prompt: the suite then knows what a correct owner must release.

The trick: GPT-2's final LayerNorm computes (x - mean) / std * weight + bias. With weight 0 its
output is exactly `bias` for every position, prompt and padding (0 times a finite number is 0),
so the logits are exactly wte @ bias, the same at every step. With bias = e_0 the logit of token
v is wte[v, 0]: the suite writes the log-probabilities it wants into that column. Every block
weight is 0 (one layer, so no padded position can feed NaN into a real one), so nothing the
owner does with prompts - truncation, padding, batching - can change a single logit.

- `coin_checkpoint`: two answer tokens with probability 1/2 each (the add-one-row check: a
  row's score over k samples is Binomial(k, 1/2) / k, random but reproducible per seed).
- `constant_checkpoint`: greedy decoding always emits one token (the timing checks: every
  row whose answer is that token scores 1, every other row 0).
- `fixed_distribution_files` with token ids as keys (e.g. `EOS_ID`): a model whose probability
  of a whole completion is the product of its tokens' probabilities, which the difference
  checks compute exactly (`completion_probability`, on `completion_ids` of the suite's tokenizer).

Written with numpy + safetensors only (no torch at suite start-up, like checkpoints.py); the
tokenizer is the suite's own byte-level BPE, whose digits are single tokens.
"""

from __future__ import annotations

import json

import numpy as np

from protocol.conformance.checkpoints import (
    CheckpointFile,
    safetensors_bytes,
    suite_tokenizer_files,
)

HIDDEN = 16
HEADS = 2
# Logit of every token outside the chosen ones: exp(-1000 / 10) is negligible even at the
# protocol's temperature cap of 10 (softmax subtracts the maximum, so nothing overflows).
OFF_LOGIT = -1000.0


def _vocab() -> dict[str, int]:
    return json.loads(suite_tokenizer_files()["tokenizer.json"])["model"]["vocab"]


def token_ids(texts: list[str]) -> dict[str, int]:
    """Ids of single-token texts in the suite's tokenizer (e.g. digits)."""
    vocab = _vocab()
    missing = [t for t in texts if t not in vocab]
    if missing:
        raise ValueError(f"not single tokens of the suite's tokenizer: {missing}")
    return {t: int(vocab[t]) for t in texts}


EOS_ID = 0
"""The id of EOS_TOKEN in the suite's tokenizer (its first special token; the checkpoints' eos_token_id)."""


def completion_ids(text: str) -> list[int]:
    """A completion as an owner teacher-forces it: `text` by the suite's tokenizer, no special
    tokens, then EOS (what an owner appends to a reference answer; cut to max_new_tokens by the caller)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(suite_tokenizer_files()["tokenizer.json"].decode("utf-8"))
    return [*tokenizer.encode(text, add_special_tokens=False).ids, EOS_ID]


def completion_probability(distribution: dict[int, float], ids: list[int]) -> float:
    """The probability of the completion `ids` under a fixed-distribution model (token id -> p, the
    same at every position): the product of its tokens' probabilities, 0 if one is outside it."""
    return float(np.prod([distribution.get(token, 0.0) for token in ids]))


def fixed_distribution_files(probabilities: dict[str | int, float], n_positions: int,
                             hidden: int = HIDDEN) -> list[CheckpointFile]:
    """A GPT-2 checkpoint whose next token is drawn from `probabilities` (token text or token id
    -> p) at every position; `n_positions` is its context (prompt + completion). A larger `hidden`
    costs more compute per token (the weights are zeros either way) and changes no output."""
    if not probabilities or any(p <= 0 for p in probabilities.values()):
        raise ValueError("probabilities must name at least one token, each with p > 0")
    tokenizer = suite_tokenizer_files()
    vocab_size = len(json.loads(tokenizer["tokenizer.json"])["model"]["vocab"])
    ids = _ids_of(list(probabilities), vocab_size)
    wte = np.zeros((vocab_size, hidden), np.float32)
    wte[:, 0] = OFF_LOGIT
    total = sum(probabilities.values())
    for token, p in probabilities.items():
        wte[ids[token], 0] = np.log(p / total)
    # Columns 1.. only feed the (zeroed) blocks; a little structure keeps LayerNorm inputs non-constant.
    wte[:, 1:] = np.random.default_rng(0).standard_normal((vocab_size, hidden - 1)).astype(np.float32) * 0.02
    final_bias = np.zeros(hidden, np.float32)
    final_bias[0] = 1.0
    tensors = {
        "transformer.wte.weight": wte,
        "transformer.wpe.weight": np.zeros((n_positions, hidden), np.float32),
        "transformer.ln_f.weight": np.zeros(hidden, np.float32),
        "transformer.ln_f.bias": final_bias,
        "transformer.h.0.ln_1.weight": np.ones(hidden, np.float32),
        "transformer.h.0.ln_1.bias": np.zeros(hidden, np.float32),
        "transformer.h.0.ln_2.weight": np.ones(hidden, np.float32),
        "transformer.h.0.ln_2.bias": np.zeros(hidden, np.float32),
        "transformer.h.0.attn.c_attn.weight": np.zeros((hidden, 3 * hidden), np.float32),
        "transformer.h.0.attn.c_attn.bias": np.zeros(3 * hidden, np.float32),
        "transformer.h.0.attn.c_proj.weight": np.zeros((hidden, hidden), np.float32),
        "transformer.h.0.attn.c_proj.bias": np.zeros(hidden, np.float32),
        "transformer.h.0.mlp.c_fc.weight": np.zeros((hidden, 4 * hidden), np.float32),
        "transformer.h.0.mlp.c_fc.bias": np.zeros(4 * hidden, np.float32),
        "transformer.h.0.mlp.c_proj.weight": np.zeros((4 * hidden, hidden), np.float32),
        "transformer.h.0.mlp.c_proj.bias": np.zeros(hidden, np.float32),
    }
    tokenizer_config = json.loads(tokenizer["tokenizer_config.json"])
    tokenizer_config["model_max_length"] = n_positions
    files = {
        "config.json": json.dumps(_gpt2_config(vocab_size, n_positions, hidden), indent=2).encode("utf-8"),
        "generation_config.json": json.dumps({"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}).encode(),
        "model.safetensors": safetensors_bytes(tensors),
        "tokenizer.json": tokenizer["tokenizer.json"],
        "tokenizer_config.json": json.dumps(tokenizer_config, indent=2).encode("utf-8"),
    }
    return [CheckpointFile(name, data) for name, data in sorted(files.items())]


def _ids_of(tokens: list[str | int], vocab_size: int) -> dict[str | int, int]:
    """Token id of each key: a text is looked up (it must be one token), an id must be in the vocabulary."""
    outside = [t for t in tokens if isinstance(t, int) and not 0 <= t < vocab_size]
    if outside:
        raise ValueError(f"token ids outside the suite's vocabulary of {vocab_size}: {outside}")
    texts = token_ids([t for t in tokens if isinstance(t, str)])
    return {t: texts[t] if isinstance(t, str) else t for t in tokens}


def coin_checkpoint(heads: str, tails: str, n_positions: int) -> list[CheckpointFile]:
    """Each sampled token is `heads` or `tails` with probability 1/2 (at any temperature > 0)."""
    return fixed_distribution_files({heads: 0.5, tails: 0.5}, n_positions)


def constant_checkpoint(token: str, n_positions: int, hidden: int = HIDDEN) -> list[CheckpointFile]:
    """Greedy decoding emits `token` at every step."""
    return fixed_distribution_files({token: 1.0}, n_positions, hidden)


def context_for(max_prompt_tokens: int, max_new_tokens: int) -> int:
    """A context length that holds an owner's fixed prompt shape plus the completion."""
    return max(128, int(max_prompt_tokens) + int(max_new_tokens) + 8)


def _gpt2_config(vocab_size: int, n_positions: int, hidden: int) -> dict:
    # Keys are a subset of what transformers' GPT2Config.save_pretrained writes (an owner may
    # allow only those); dropout 0 so nothing depends on train/eval mode.
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab_size,
        "n_positions": n_positions,
        "n_embd": hidden,
        "n_layer": 1,
        "n_head": HEADS,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "tie_word_embeddings": True,
        "use_cache": True,
        "dtype": "float32",
    }
