"""Build the project's own tiny policy: local tokenizer + random-init Qwen2/Llama + SFT warm-up.

Nothing is downloaded. A build is content-addressed: the cache key is a sha256 over
(spec, tokenizer texts, SFT pairs, BUILD_CODE_VERSION), and the result lives in
`cache_root/<architecture>-<key>/`. The directory is built under a temporary name and renamed
into place, so an existing cache directory is always complete. A small
`<dir name>.build.json` beside it records the spec, parameter count, loss curve and timing.

Builds are deterministic ON ONE MACHINE: the model is initialised and warmed up under a forked
torch RNG seeded from spec.seed, on one CPU thread (see models/threads.py), so two builds of the
same inputs with the same library versions on the same machine give byte-identical files: CPU
kernels may reduce in a different order with another thread count, and one thread is also the
fastest choice for a model this small on a busy 2-core box.

Across machines they are NOT: torch dispatches its CPU kernels by instruction set (AVX-512,
AVX2, ...), and another kernel rounds differently. On the project's AMD EPYC box, forcing
ATen's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) instead of its AVX-512 ones changes the weights
after 40 warm-up steps; over 900 steps that is another policy (the default testbed's start
measured 47.5% on the machine of docs/RESULTS.md section 3, 48.1% here, from the same cache key
and the same evaluation code; docs/RESULTS.md section 9). So the build record notes the CPU
capability and the checkpoint digest, simulate records the digest of every run's start, and the
bench pairs only runs that share it (lab/bench/results.py same_start).

Bump BUILD_CODE_VERSION whenever a change here would change the weights a spec produces.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rlvr_core.models.loading import UnsafeCheckpointError, check_model_dir, save_policy
from rlvr_core.models.sft import SftSettings, supervised_warmup
from rlvr_core.models.threads import torch_threads
from rlvr_core.models.tiny_spec import TinyPolicySpec
from rlvr_core.models.tokenizer import train_tokenizer

__all__ = [
    "BUILD_CODE_VERSION",
    "TinyPolicySpec",
    "build_tiny_policy",
    "cache_key",
    "checkpoint_digest",
    "count_parameters",
    "random_tiny_policy",
    "train_tokenizer",
]

BUILD_CODE_VERSION = "tiny-policy-v2"

_MODEL_CLASSES = {  # one per TinyPolicySpec.architecture
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}


def cache_key(spec: TinyPolicySpec, tokenizer_texts: list[str], sft_pairs: list[tuple[str, str]]) -> str:
    """sha256 over everything that determines the built weights."""
    digest = hashlib.sha256()
    for part in (BUILD_CODE_VERSION, asdict(spec), tokenizer_texts, [list(pair) for pair in sft_pairs]):
        digest.update(json.dumps(part, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def checkpoint_digest(model_dir: str | Path) -> str:
    """sha256 over what decides a checkpoint's behaviour: its weight files and tokenizer files
    (name and content), not config files that record library versions. Two runs start from the
    same policy exactly when their digests match (the bench pairs only such runs)."""
    directory = Path(model_dir)
    digest = hashlib.sha256()
    files = sorted(p for p in directory.iterdir() if p.is_file() and (p.suffix == ".safetensors"
                                                                     or p.name.startswith("tokenizer")))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors or tokenizer files to digest")
    for path in files:
        digest.update(path.name.encode("utf-8") + b"\x00")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def _random_model(spec: TinyPolicySpec, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    config_class, model_class = _MODEL_CLASSES[spec.architecture]
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position,
        rope_theta=spec.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.architectures = [model_class.__name__]
    torch.manual_seed(spec.seed)  # caller wraps this in fork_rng: the global RNG is restored
    return model_class(config)


def _build_into(
    spec: TinyPolicySpec,
    tokenizer_texts: list[str],
    sft_pairs: list[tuple[str, str]],
    out_dir: Path,
    progress: bool,
) -> dict[str, Any]:
    """Train tokenizer, init model, warm up, save into `out_dir`; return the build record."""
    started, started_cpu = time.perf_counter(), time.process_time()
    tokenizer = train_tokenizer(tokenizer_texts, spec.vocab_size, spec.seed)
    tokenizer.model_max_length = spec.max_position
    with torch.random.fork_rng(devices=[]), torch_threads(1):
        model = _random_model(spec, tokenizer)
        settings = SftSettings(spec.sft_steps, spec.sft_batch_size, spec.sft_lr, spec.seed, spec.max_position)
        losses = supervised_warmup(model, tokenizer, sft_pairs, settings, progress=progress)
    model.eval()
    save_policy(model, tokenizer, out_dir)
    return {
        "code_version": BUILD_CODE_VERSION,
        "spec": asdict(spec),
        "vocab_size": len(tokenizer),
        "num_parameters": count_parameters(model),
        "num_tokenizer_texts": len(tokenizer_texts),
        "num_sft_pairs": len(sft_pairs),
        "sft_loss_first": losses[0] if losses else None,
        "sft_loss_last": losses[-1] if losses else None,
        "sft_losses": losses,
        "build_seconds": round(time.perf_counter() - started, 3),
        "build_cpu_seconds": round(time.process_time() - started_cpu, 3),  # = wall time on an idle box
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernels' instruction set
        "checkpoint_digest": checkpoint_digest(out_dir),
    }


def build_tiny_policy(
    spec: TinyPolicySpec,
    tokenizer_texts: list[str],
    sft_pairs: list[tuple[str, str]],
    cache_root: Path,
    progress: bool = True,
) -> Path:
    """Return the directory of the tiny policy for these inputs, building it on a cache miss.

    `sft_pairs` are already rendered (prompt "{prompt}\\nAnswer:", completion " {answer}"); the
    warm-up trains on prompt + completion + EOS with loss on the completion. A cache hit
    returns at once. The build happens in a temporary sibling directory renamed into place,
    so a crash never leaves a half-built cache entry; if another process wins the race, its
    (identical) result is used.
    """
    cache_root = Path(cache_root)
    target = cache_root / f"{spec.architecture}-{cache_key(spec, tokenizer_texts, sft_pairs)[:32]}"
    if target.exists():
        try:
            check_model_dir(target)
        except UnsafeCheckpointError as error:
            raise UnsafeCheckpointError(f"cache entry {target} is invalid ({error}); delete it to rebuild") from error
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".building-{target.name}-", dir=cache_root))
    try:
        record = _build_into(spec, tokenizer_texts, sft_pairs, staging / "model", progress)
        try:
            os.rename(staging / "model", target)
        except OSError:
            if not target.exists():
                raise
            return target  # a concurrent build finished first
        _write_json_atomically(cache_root / f"{target.name}.build.json", record)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_json_atomically(path: Path, value: dict[str, Any]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(temporary, path)


# Small enough that building and loading take well under a second.
_RANDOM_TINY_DEFAULTS: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 64,
    "max_position": 128,
    "sft_steps": 0,
}


def random_tiny_policy(out_dir: str | Path, vocab_texts: list[str], seed: int = 0, **spec_overrides: Any) -> Path:
    """Save a very small random-init policy (hidden 32, 2 layers, no warm-up) into `out_dir`.

    Meant for fast tests: a valid checkpoint directory that load_policy accepts. Any
    TinyPolicySpec field can be overridden; with sft_steps > 0 pass `sft_pairs=[...]` too.
    """
    sft_pairs = spec_overrides.pop("sft_pairs", [])
    spec = replace(TinyPolicySpec(), **{**_RANDOM_TINY_DEFAULTS, "seed": seed, **spec_overrides})
    _build_into(spec, vocab_texts, sft_pairs, Path(out_dir), progress=False)
    return Path(out_dir)
