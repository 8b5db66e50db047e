"""The checkpoints the suite uploads: a valid tiny one, and deliberately bad variants.

The valid checkpoint is a random-init Qwen2 with hidden size 32 and 2 layers (the same shape
as rlvr_core.models.random_tiny_policy), written with numpy + safetensors + tokenizers only:
importing torch/transformers would cost the suite 10-20 s of start-up on a small machine,
while the server evaluates it through its own transformers loader either way. Pass
SuiteOptions.checkpoint_dir to upload a checkpoint of your own instead.

Content addressing: the owner names a checkpoint by `checkpoint_id_for(manifest)`, so the
suite can compute the id a refused upload WOULD have had and verify it was not stored.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.validation import (
    MAX_CHUNK_BYTES,
    checkpoint_id_for,  # noqa: F401  (the shared content address)
)

EOS_TOKEN = "<|endoftext|>"
_VOCAB_TEXTS = [
    "0123456789 + - * / = ( ) . , ? ! : ;",
    "What is 12 + 7? Answer: 19",
    "Compute 3 * 4 - 5. The answer is 7.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "Question: how many? Final answer: \\boxed{42}",
]
# The input embedding's tensor name per architecture family (Qwen2/Llama style, GPT-2).
EMBEDDING_TENSORS = ("model.embed_tokens.weight", "transformer.wte.weight")
# max_position: room for an owner's fixed prompt shape (left-padded to max_prompt_tokens) plus the
# completion; rotary positions cost nothing to allow.
_SHAPE = {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64, "max_position": 1024}


@dataclass(frozen=True)
class CheckpointFile:
    name: str
    data: bytes

    @property
    def entry(self) -> pb.FileEntry:
        return pb.FileEntry(name=self.name, size=len(self.data), sha256=sha256_hex(self.data))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tokenizer_files() -> dict[str, bytes]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_VOCAB_TEXTS, trainer=trainer)
    config = {
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "padding_side": "left",
        "model_max_length": _SHAPE["max_position"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return {
        "tokenizer.json": tokenizer.to_str().encode("utf-8"),
        "tokenizer_config.json": json.dumps(config, indent=2).encode("utf-8"),
        "_vocab_size": str(tokenizer.get_vocab_size()).encode(),
    }


def _model_config(vocab_size: int) -> dict:
    s = _SHAPE
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab_size,
        "hidden_size": s["hidden"],
        "intermediate_size": s["intermediate"],
        "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "max_position_embeddings": s["max_position"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": None,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "dtype": "float32",
    }


def _weights(vocab_size: int, seed: int) -> dict[str, np.ndarray]:
    """Random Qwen2 weights named as transformers names them (lm_head tied to embeddings)."""
    rng = np.random.default_rng(seed)
    s = _SHAPE
    head_dim = s["hidden"] // s["heads"]
    kv = s["kv_heads"] * head_dim

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(vocab_size, s["hidden"]),
               "model.norm.weight": np.ones(s["hidden"], np.float32)}
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": np.ones(s["hidden"], np.float32),
            p + "post_attention_layernorm.weight": np.ones(s["hidden"], np.float32),
            p + "self_attn.q_proj.weight": normal(s["hidden"], s["hidden"]),
            p + "self_attn.q_proj.bias": np.zeros(s["hidden"], np.float32),
            p + "self_attn.k_proj.weight": normal(kv, s["hidden"]),
            p + "self_attn.k_proj.bias": np.zeros(kv, np.float32),
            p + "self_attn.v_proj.weight": normal(kv, s["hidden"]),
            p + "self_attn.v_proj.bias": np.zeros(kv, np.float32),
            p + "self_attn.o_proj.weight": normal(s["hidden"], s["hidden"]),
            p + "mlp.gate_proj.weight": normal(s["intermediate"], s["hidden"]),
            p + "mlp.up_proj.weight": normal(s["intermediate"], s["hidden"]),
            p + "mlp.down_proj.weight": normal(s["hidden"], s["intermediate"]),
        })
    return tensors


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return save(tensors, metadata={"format": "pt"})


def suite_tokenizer_files() -> dict[str, bytes]:
    """tokenizer.json and tokenizer_config.json of the suite's checkpoints (byte-level BPE, EOS id 0)."""
    files = _tokenizer_files()
    files.pop("_vocab_size")
    return files


def tiny_checkpoint_files(seed: int) -> list[CheckpointFile]:
    """The files of a valid tiny Qwen2 checkpoint (deterministic for a seed)."""
    tokenizer = _tokenizer_files()
    vocab_size = int(tokenizer.pop("_vocab_size"))
    generation = {"eos_token_id": 0, "pad_token_id": 0}
    files = {
        "config.json": json.dumps(_model_config(vocab_size), indent=2).encode("utf-8"),
        "generation_config.json": json.dumps(generation, indent=2).encode("utf-8"),
        "model.safetensors": safetensors_bytes(_weights(vocab_size, seed)),
        **tokenizer,
    }
    return [CheckpointFile(name, data) for name, data in sorted(files.items())]


def load_checkpoint_dir(path: Path) -> list[CheckpointFile]:
    """A checkpoint directory as files (regular files only, sorted by name)."""
    return [CheckpointFile(p.name, p.read_bytes()) for p in sorted(Path(path).iterdir()) if p.is_file()]


def write_checkpoint(files: list[CheckpointFile], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in files:
        (out_dir / f.name).write_bytes(f.data)
    return out_dir


def with_nonce(files: list[CheckpointFile], nonce: str) -> list[CheckpointFile]:
    """The same checkpoint made unique (a marker in generation_config.json), so that the id a
    refused upload would have had cannot belong to anything stored earlier."""
    out = []
    for f in files:
        if f.name == "generation_config.json":
            value = json.loads(f.data)
            value["conformance_nonce"] = nonce
            f = CheckpointFile(f.name, json.dumps(value, indent=2).encode("utf-8"))
        out.append(f)
    if not any(f.name == "generation_config.json" for f in out):
        out.append(CheckpointFile("generation_config.json", json.dumps({"conformance_nonce": nonce}).encode()))
    return sorted(out, key=lambda f: f.name)


def upload_messages(
    files: list[CheckpointFile],
    manifest: list[pb.FileEntry] | None = None,
    chunk_bytes: int = MAX_CHUNK_BYTES,
    send: set[str] | None = None,
) -> list[pb.UploadCheckpointRequest]:
    """A manifest (by default derived from `files`) followed by in-order chunks of every file
    (or of the files named in `send`)."""
    entries = manifest if manifest is not None else [f.entry for f in files]
    messages = [pb.UploadCheckpointRequest(manifest=pb.CheckpointManifest(files=entries))]
    for f in files:
        if send is not None and f.name not in send:
            continue
        messages += chunk_messages(f.name, f.data, chunk_bytes)
    return messages


def chunk_messages(name: str, data: bytes, chunk_bytes: int = MAX_CHUNK_BYTES) -> list[pb.UploadCheckpointRequest]:
    return [
        pb.UploadCheckpointRequest(chunk=pb.FileChunk(name=name, offset=offset, data=data[offset:offset + chunk_bytes]))
        for offset in range(0, len(data), chunk_bytes)
    ]


def stream(messages: list[pb.UploadCheckpointRequest]) -> Iterator[pb.UploadCheckpointRequest]:
    yield from messages


# -- editing a checkpoint's files ------------------------------------------------------------------
def file_data(files: list[CheckpointFile], name: str) -> bytes:
    return next(f.data for f in files if f.name == name)


def replace_file(files: list[CheckpointFile], name: str, data: bytes) -> list[CheckpointFile]:
    """`files` with `name` holding `data` (added when absent), sorted by name."""
    kept = [f for f in files if f.name != name]
    return sorted(kept + [CheckpointFile(name, data)], key=lambda f: f.name)


def edit_json(files: list[CheckpointFile], name: str, edit) -> list[CheckpointFile]:
    """`files` with the JSON object in `name` passed through `edit(obj) -> None` (in place)."""
    value = json.loads(file_data(files, name))
    edit(value)
    return replace_file(files, name, json.dumps(value, indent=2).encode("utf-8"))


def embedding_rows(files: list[CheckpointFile]) -> int:
    """Rows of the input embedding, read from the safetensors header (no tensor is loaded)."""
    weights = file_data(files, "model.safetensors")
    (length,) = struct.unpack("<Q", weights[:8])
    header = json.loads(weights[8:8 + length])
    for name in EMBEDDING_TENSORS:
        if name in header:
            return int(header[name]["shape"][0])
    raise ValueError(f"model.safetensors holds none of the embedding tensors {EMBEDDING_TENSORS}")


def with_added_token(files: list[CheckpointFile], content: str) -> tuple[list[CheckpointFile], int]:
    """The checkpoint with one added token for `content` whose id is the embedding's row count:
    out of range, so embedding it raises - exactly on prompts that contain `content` (the
    membership attack of issue 11). Returns the files and the token id."""
    token_id = embedding_rows(files)
    data = tokenizer_with_token_past_embedding(file_data(files, "tokenizer.json"), token_id, content)
    return replace_file(files, "tokenizer.json", data), token_id


def with_token_past_embedding(
    files: list[CheckpointFile], content: str = "CONFORMANCE-GUESS"
) -> list[CheckpointFile]:
    """The checkpoint with one added token for `content` one past the embedding (see with_added_token)."""
    return with_added_token(files, content)[0]


def tokenizer_with_token_past_embedding(tokenizer_json: bytes, rows: int, content: str) -> bytes:
    """tokenizer.json bytes with one added token, `content`, at id `rows`: one past the last
    embedding row. A server that accepts it fails Evaluate exactly when a sampled prompt holds
    `content` (issue 11, hole 1); it must be refused at upload."""
    tokenizer = json.loads(tokenizer_json)
    tokenizer["added_tokens"] = [*tokenizer.get("added_tokens", []), {
        "id": rows, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
        "normalized": False, "special": False,
    }]
    return json.dumps(tokenizer, ensure_ascii=False).encode("utf-8")


# -- candidates as deltas (GetInfo delta_support) -----------------------------------------------


def tensor_shard_files(files: list[CheckpointFile], change: dict[str, np.ndarray] | None = None) -> list[CheckpointFile]:
    """The checkpoint with model.safetensors split into one shard per tensor plus the index
    (how a trainer sends candidates so that unchanged tensors are never resent); `change`
    replaces some tensors' values."""
    from safetensors.numpy import load

    tensors = dict(load(file_data(files, "model.safetensors")))
    tensors.update(change or {})
    names = sorted(tensors)
    shards, weight_map = [], {}
    for i, name in enumerate(names):
        shard = f"model-{i + 1:05d}-of-{len(names):05d}.safetensors"
        shards.append(CheckpointFile(shard, safetensors_bytes({name: tensors[name]})))
        weight_map[name] = shard
    index = json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1, sort_keys=True).encode()
    rest = [f for f in files if f.name != "model.safetensors"]
    return sorted(rest + shards + [CheckpointFile("model.safetensors.index.json", index)], key=lambda f: f.name)


LORA_MODULES = ("q_proj", "v_proj")


def lora_adapter_files(
    files: list[CheckpointFile], rank: int = 4, seed: int = 0, alpha: float = 8.0,
    config_changes: dict | None = None, tensors_changes: dict[str, np.ndarray | None] | None = None,
) -> list[CheckpointFile]:
    """The checkpoint plus a LoRA adapter on every q_proj and v_proj (adapter_config.json +
    adapter_model.safetensors, as PEFT names them); `*_changes` break it on purpose (None drops a tensor)."""
    from safetensors.numpy import load

    weights = {}
    for f in files:
        if f.name.endswith(".safetensors"):
            weights.update(load(f.data))
    rng = np.random.default_rng(seed)
    adapter: dict[str, np.ndarray] = {}
    for name, tensor in sorted(weights.items()):
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in LORA_MODULES:
            out_features, in_features = tensor.shape
            adapter[f"base_model.model.{module}.lora_A.weight"] = (rng.standard_normal((rank, in_features)) * 0.1).astype(np.float32)
            adapter[f"base_model.model.{module}.lora_B.weight"] = (rng.standard_normal((out_features, rank)) * 0.1).astype(np.float32)
    for name, value in (tensors_changes or {}).items():
        if value is None:
            adapter.pop(name, None)
        else:
            adapter[name] = value
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(LORA_MODULES),
              "bias": "none", "task_type": "CAUSAL_LM", **(config_changes or {})}
    extra = [CheckpointFile("adapter_config.json", json.dumps(config, indent=1).encode()),
             CheckpointFile("adapter_model.safetensors", safetensors_bytes(adapter))]
    return sorted([f for f in files if f.name not in ("adapter_config.json", "adapter_model.safetensors")] + extra,
                  key=lambda f: f.name)
