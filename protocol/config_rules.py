"""config.json: which architectures, model types, keys and values an uploaded checkpoint may use.

One rule for both places that read a config: the owner's upload path (protocol.validation
.validate_checkpoint_dir) and the model loader (rlvr_core.models.loading.check_model_dir), so a
checkpoint can never pass upload and then fail to load after a privacy charge.

The key lists are static data (protocol must not import transformers). They are the union of
what transformers' own config classes write, `to_dict()` and `save_pretrained`, for 4.46.3,
4.57.1 and the installed 5.x; tests/protocol/test_validation_config.py checks that they still
cover what the installed transformers writes for every allowed architecture. To refresh the
4.x part: `pip install --no-deps --target DIR transformers==4.46.3 tokenizers==0.20.3
"huggingface_hub<1.0"` and print `AutoConfig.for_model(model_type).to_dict()` with DIR first
on PYTHONPATH.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from protocol.refusal import is_int, key_path, refuse, shown
from protocol.tokenizer_rules import ALLOWED_TOKENIZER_CLASSES

# Causal-LM classes whose code ships with transformers itself (no remote code).
ALLOWED_ARCHITECTURES: tuple[str, ...] = (
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "GPT2LMHeadModel",
)

# AutoModelForCausalLM picks the class from `model_type`, not from `architectures`, so both must
# agree: otherwise a config could name an allowed architecture and load a different class.
MODEL_TYPE_OF_ARCHITECTURE: dict[str, str] = {
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "GPT2LMHeadModel": "gpt2",
}

# PretrainedConfig's own keys (every model type): 5.x writes the first line; 4.46-4.57 also
# wrote the generation defaults and legacy flags below it (inert here: the engines decode with
# their own loop and settings, never from these).
COMMON_CONFIG_KEYS: frozenset[str] = frozenset(
    {
        "_name_or_path", "architectures", "chunk_size_feed_forward", "dtype", "id2label",
        "is_encoder_decoder", "label2id", "model_type", "output_attentions", "output_hidden_states",
        "problem_type", "return_dict", "transformers_version", "bos_token_id", "eos_token_id",
        "pad_token_id", "tie_word_embeddings",
        # transformers 4.46-4.57
        "_attn_implementation_autoset", "add_cross_attention", "bad_words_ids", "begin_suppress_tokens",
        "cross_attention_hidden_size", "decoder_start_token_id", "diversity_penalty", "do_sample",
        "early_stopping", "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty",
        "finetuning_task", "forced_bos_token_id", "forced_eos_token_id", "is_decoder", "length_penalty",
        "max_length", "min_length", "no_repeat_ngram_size", "num_beam_groups", "num_beams",
        "num_return_sequences", "output_scores", "prefix", "pruned_heads", "remove_invalid_values",
        "repetition_penalty", "return_dict_in_generate", "sep_token_id", "suppress_tokens",
        "task_specific_params", "temperature", "tf_legacy_loss", "tie_encoder_decoder",
        "tokenizer_class", "top_k", "top_p", "torch_dtype", "torchscript", "typical_p", "use_bfloat16",
        # not written by save_pretrained, but a config may set them; values restricted below
        "attn_implementation", "_attn_implementation",
    }
)

_DECODER_KEYS = (
    "attention_dropout", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
    "max_position_embeddings", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
    "rms_norm_eps", "use_cache", "vocab_size",
    "rope_parameters",  # 5.x
    "rope_theta",  # 4.x (5.x folds it into rope_parameters)
)

# Keys of each model type's own config class, beyond COMMON_CONFIG_KEYS.
CONFIG_KEYS_OF_MODEL_TYPE: dict[str, frozenset[str]] = {
    "qwen2": frozenset(
        {*_DECODER_KEYS, "layer_types", "max_window_layers", "rope_scaling", "sliding_window",
         "use_sliding_window"}
    ),
    "qwen3": frozenset(
        {*_DECODER_KEYS, "attention_bias", "head_dim", "layer_types", "max_window_layers", "rope_scaling",
         "sliding_window", "use_sliding_window"}
    ),
    "llama": frozenset(
        {*_DECODER_KEYS, "attention_bias", "head_dim", "mlp_bias", "pretraining_tp", "rope_scaling"}
    ),
    "mistral": frozenset({*_DECODER_KEYS, "head_dim", "sliding_window"}),
    "gpt2": frozenset(
        {
            "activation_function", "attn_pdrop", "embd_pdrop", "initializer_range", "layer_norm_epsilon",
            "n_embd", "n_head", "n_inner", "n_layer", "n_positions", "reorder_and_upcast_attn",
            "resid_pdrop", "scale_attn_by_inverse_layer_idx", "scale_attn_weights", "summary_activation",
            "summary_first_dropout", "summary_proj_to_labels", "summary_type", "summary_use_proj",
            "use_cache", "vocab_size",
            "n_ctx",  # written by the original GPT-2 configs on the hub
        }
    ),
}

# The config key holding the embedding width, per model type.
HIDDEN_SIZE_KEY: dict[str, str] = {"gpt2": "n_embd"}

# Keys refused outright, and why (each selects code we do not vet or cannot load safely).
REFUSED_CONFIG_KEYS: dict[str, str] = {
    "auto_map": "it points transformers at Python code shipped with the checkpoint (remote code)",
    "quantization_config": (
        "loading it selects a quantizer backend (bitsandbytes, GPTQ, AWQ, kernels fetched from the hub) "
        "whose code the owner does not vet; upload unquantized safetensors"
    ),
}

_VETTED_ATTENTION = "only the built-in eager and sdpa attention are vetted"

# Keys allowed only with these values, and why.
RESTRICTED_CONFIG_VALUES: dict[str, tuple[tuple[Any, ...], str]] = {
    # flash-attention, flex-attention and hub kernels are other code paths (and can download code).
    "attn_implementation": ((None, "eager", "sdpa"), _VETTED_ATTENTION),
    "_attn_implementation": ((None, "eager", "sdpa"), _VETTED_ATTENTION),
    # Tuple outputs: the engine reads `.logits`, so it would fail after the charge.
    "return_dict": ((True,), "the engines read the model's output by name"),
    "torchscript": ((False,), "it makes the model return tuples, which the engines cannot read"),
    # Every layer's attention maps / hidden states: the eager path and memory that grows with the prompt.
    "output_attentions": ((False,), "it forces the eager path and returns every attention map"),
    "output_hidden_states": ((False,), "it returns every layer's hidden states"),
    # Encoder-decoder wiring a causal LM never feeds.
    "add_cross_attention": ((False,), "it adds cross-attention blocks a causal LM never feeds"),
    "is_encoder_decoder": ((False,), "the allowed architectures are decoder-only"),
    "tie_encoder_decoder": ((False,), "the allowed architectures are decoder-only"),
    # Prunes attention heads at construction: a code path we do not vet.
    "pruned_heads": (({},), "head pruning at load is not supported"),
    # Inert (the loader reads tokenizer.json with PreTrainedTokenizerFast), kept to the same short list.
    "tokenizer_class": (
        (None, *sorted(ALLOWED_TOKENIZER_CLASSES)), "tokenizer.json is read with PreTrainedTokenizerFast"
    ),
}

# Rotary-embedding variants built into transformers (others would fail to construct the model).
ALLOWED_ROPE_TYPES: frozenset[str] = frozenset({"default", "linear", "dynamic", "yarn", "longrope", "llama3"})
ALLOWED_LAYER_TYPES: frozenset[str] = frozenset({"full_attention", "sliding_attention"})

# Token-id fields of config.json / generation_config.json (an int, or a list of ints for eos).
TOKEN_ID_KEYS: tuple[str, ...] = (
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "forced_bos_token_id", "forced_eos_token_id",
)


def allowed_config_keys(model_type: str) -> frozenset[str]:
    """Every key config.json may hold for `model_type` (KeyError for a type we do not allow)."""
    return COMMON_CONFIG_KEYS | CONFIG_KEYS_OF_MODEL_TYPE[model_type]


def check_config(config: dict[str, Any], allowed_architectures: Iterable[str] = ALLOWED_ARCHITECTURES) -> str:
    """Check a parsed config.json; return its model_type.

    Refuses (INVALID_CHECKPOINT, naming the key): `auto_map` or `quantization_config` anywhere,
    `architectures` outside the allowlist, a `model_type` that disagrees with the architecture,
    any key not in allowed_config_keys(model_type), restricted keys with other values, unknown
    rope or layer types, and a `vocab_size` / hidden size that is not a positive int.
    """
    # Narrowing only: an architecture without a vetted model_type can never be allowed.
    allowed = tuple(a for a in allowed_architectures if a in MODEL_TYPE_OF_ARCHITECTURE)
    for key, why in REFUSED_CONFIG_KEYS.items():
        where = key_path(config, key)
        if where is not None:
            raise refuse(f"config.json: {shown(where)} is not allowed: {why}")
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise refuse("config.json: 'architectures' must be a non-empty list")
    for architecture in architectures:
        if not isinstance(architecture, str) or architecture not in allowed:
            raise refuse(
                f"config.json: 'architectures' entry {shown(architecture)} is not allowed; "
                f"allowed: {', '.join(allowed)}"
            )
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise refuse("config.json: 'model_type' must be a non-empty string")
    for architecture in architectures:
        expected = MODEL_TYPE_OF_ARCHITECTURE[architecture]
        if model_type != expected:
            raise refuse(
                f"config.json: 'model_type' is {shown(model_type)} but architecture {architecture} "
                f"needs {expected!r} (transformers picks the model class from model_type)"
            )
    unknown = sorted(set(config) - allowed_config_keys(model_type))
    if unknown:
        raise refuse(
            f"config.json: key {shown(unknown[0])} is not allowed for model_type {model_type!r} "
            f"({len(unknown)} unknown key(s)); only keys transformers' {model_type} config writes are allowed"
        )
    for key, (values, why) in RESTRICTED_CONFIG_VALUES.items():
        if key in config and not any(_same_json(config[key], value) for value in values):
            shown_values = ", ".join("null" if v is None else repr(v) for v in values)
            raise refuse(f"config.json: {key!r} must be {shown_values}: {why}")
    for key in ("vocab_size", HIDDEN_SIZE_KEY.get(model_type, "hidden_size")):
        if not is_int(config.get(key)) or config[key] < 1:
            raise refuse(f"config.json: {key!r} must be a positive integer")
    _check_rope(config)
    layer_types = config.get("layer_types")
    if layer_types is not None and (
        not isinstance(layer_types, list) or not all(item in ALLOWED_LAYER_TYPES for item in layer_types)
    ):
        raise refuse(f"config.json: 'layer_types' must list only {', '.join(sorted(ALLOWED_LAYER_TYPES))}")
    return model_type


def _same_json(value: Any, expected: Any) -> bool:
    """JSON equality that keeps true apart from 1 (Python's True == 1)."""
    return type(value) is type(expected) and value == expected


def _check_rope(config: dict[str, Any]) -> None:
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise refuse(f"config.json: {key!r} must be an object or null")
        for type_key in ("rope_type", "type"):
            if type_key in value and value[type_key] not in ALLOWED_ROPE_TYPES:
                raise refuse(
                    f"config.json: '{key}.{type_key}' must be one of {', '.join(sorted(ALLOWED_ROPE_TYPES))}"
                )


def check_token_id_fields(config: dict[str, Any], rows: int, embedding: str, file_name: str) -> None:
    """Every token id config.json / generation_config.json names (eos, pad, ...) must be a row of
    the input embedding: a pad or eos id is fed back into the model once a row has finished."""
    for key in TOKEN_ID_KEYS:
        value = config.get(key)
        if value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            if not is_int(item) or item < 0:
                raise refuse(f"{file_name}: {key!r} must be a non-negative integer, a list of them, or null")
            if item >= rows:
                raise refuse(
                    f"{file_name}: {key!r} is {item}, but the input embedding {embedding} has {rows} rows"
                )
