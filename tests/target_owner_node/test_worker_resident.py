"""The worker's model cache: a candidate of a structure in memory is applied in place, file by
changed file, and scores exactly as a fresh from_pretrained load of that candidate would."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlvr_core.engines.base import SamplingParams
from target_owner_node.worker import ModelCache, WorkerSpec, evaluation_shape

SPEC = WorkerSpec(
    heldout_path=Path("unused.jsonl"), test_path=None, verifier="exact_match", prompt_template="{prompt}",
    engine="transformers", device="cpu", dtype="float32", batch_size=4, model_cache_size=2, max_prompt_tokens=8,
)
PROMPTS = ["1+1=", "2+1=", "0+1=", "2+2="]


def sharded(source: Path, out: Path, change=None) -> tuple[Path, dict[str, str]]:
    """`source` rewritten with one safetensors shard per tensor (as the trainer's candidates are),
    `change(name, tensor)` applied to each tensor; returns the folder and its files' sha256."""
    out.mkdir(parents=True)
    for path in source.iterdir():
        if path.suffix == ".json":
            shutil.copyfile(path, out / path.name)
    tensors = load_file(str(source / "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for i, name in enumerate(names):
        tensor = tensors[name] if change is None else change(name, tensors[name])
        shard = f"model-{i + 1:05d}-of-{len(names):05d}.safetensors"
        save_file({name: tensor.contiguous()}, str(out / shard), metadata={"format": "pt"})
        weight_map[name] = shard
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}
    return out, digests


def generations(engine) -> list:
    params = SamplingParams(max_new_tokens=4, temperature=1.0, top_p=1.0, seed=11)
    out = engine.generate(PROMPTS, 2, params, row_keys=list(range(len(PROMPTS))),
                          shape=evaluation_shape(SPEC, engine, 4))
    return [[tuple(g.completion_ids) for g in row] for row in out]


def state(engine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.model.state_dict().items()}


@pytest.fixture
def checkpoints(tiny_checkpoint, tmp_path):
    base = sharded(tiny_checkpoint, tmp_path / "base")
    one = sharded(tiny_checkpoint, tmp_path / "one",
                  lambda n, t: t + 0.05 if n.endswith("layers.0.mlp.down_proj.weight") else t)
    every = sharded(tiny_checkpoint, tmp_path / "every", lambda n, t: t * 1.01)
    return {"base": base, "one": one, "every": every}


def test_a_candidate_is_applied_in_place_and_equals_a_fresh_load(checkpoints):
    cache = ModelCache(SPEC)
    (base, base_digests), (one, one_digests) = checkpoints["base"], checkpoints["one"]
    cache.get("base", base, base_digests)
    engine = cache.get("one", one, one_digests)
    assert cache.full_loads == 1 and cache.files_applied == 1, "only the one changed shard is read"
    fresh = ModelCache(SPEC).get("one", one, one_digests)
    assert all(torch.equal(v, fresh.model.state_dict()[k]) for k, v in state(engine).items())
    assert generations(engine) == generations(fresh)

    again = cache.get("base", base, base_digests)  # back to the base: the one shard again
    assert cache.full_loads == 1 and cache.files_applied == 2
    fresh_base = ModelCache(SPEC).get("base", base, base_digests)
    assert all(torch.equal(v, fresh_base.model.state_dict()[k]) for k, v in state(again).items())
    assert generations(again) == generations(fresh_base)


def test_every_candidate_of_a_query_scores_as_if_loaded_alone_in_any_order(checkpoints):
    cache = ModelCache(SPEC)
    alone = {name: generations(ModelCache(SPEC).get(name, *checkpoints[name])) for name in checkpoints}
    for name in ("every", "base", "one", "every", "one"):
        assert generations(cache.get(name, *checkpoints[name])) == alone[name]
    assert cache.full_loads == 1


def test_without_digests_every_file_is_read_again_and_the_result_is_the_same(checkpoints):
    cache = ModelCache(SPEC)
    base, _ = checkpoints["base"]
    one, one_digests = checkpoints["one"]
    cache.get("base", base, None)
    engine = cache.get("one", one, None)
    assert cache.files_applied == len([n for n in one_digests if n.endswith(".safetensors")])
    assert generations(engine) == generations(ModelCache(SPEC).get("one", one, one_digests))


def test_a_structure_whose_stored_tensors_do_not_map_one_to_one_is_reloaded_in_full(checkpoints, tiny_checkpoint,
                                                                                  tmp_path):
    # The tied output head stored beside the embedding: two stored tensors land on one parameter,
    # so a copy could not say which wins; from_pretrained decides, every time.
    def with_head(source: Path, out: Path, scale: float) -> tuple[Path, dict[str, str]]:
        folder, _ = sharded(source, out, lambda n, t: t * scale)
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        shard = index["weight_map"]["model.embed_tokens.weight"]
        embedding = load_file(str(folder / shard))["model.embed_tokens.weight"]
        save_file({"model.embed_tokens.weight": embedding, "lm_head.weight": embedding.clone()},
                  str(folder / shard), metadata={"format": "pt"})
        index["weight_map"]["lm_head.weight"] = shard
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        return folder, {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}

    config = json.loads((tiny_checkpoint / "config.json").read_text())
    if not config.get("tie_word_embeddings", False):
        pytest.skip("the tiny policy does not tie its embeddings")
    cache = ModelCache(replace(SPEC, model_cache_size=1))
    first = with_head(tiny_checkpoint, tmp_path / "h1", 1.0)
    second = with_head(tiny_checkpoint, tmp_path / "h2", 1.02)
    cache.get("h1", *first)
    cache.get("h2", *second)
    assert cache.full_loads == 2 and cache.files_applied == 0


def with_adapter(source: Path, digests: dict[str, str], out: Path, rank: int = 2, alpha: float = 4.0, seed: int = 0):
    """`source` plus a LoRA adapter on every q_proj and v_proj (as PEFT writes one); returns the
    folder, its digests and the adapter's tensors."""
    shutil.copytree(source, out)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, weight in _weights(source).items():
        module = name.removesuffix(".weight")
        if module.rsplit(".", 1)[-1] in ("q_proj", "v_proj"):
            out_features, in_features = weight.shape
            tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator)
            tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": ["q_proj", "v_proj"]}))
    digests = dict(digests) | {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                               for p in out.iterdir() if p.name.startswith("adapter_")}
    return out, digests, tensors


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def merged(source: Path, out: Path, tensors: dict[str, torch.Tensor], scale: float) -> tuple[Path, dict[str, str]]:
    """`source` with W + scale * B A written into its weights (what PEFT's merge_and_unload gives)."""
    prefix = "base_model.model."

    def change(name, tensor):
        a = tensors.get(f"{prefix}{name.removesuffix('.weight')}.lora_A.weight")
        if a is None:
            return tensor
        b = tensors[f"{prefix}{name.removesuffix('.weight')}.lora_B.weight"]
        return tensor + scale * (b @ a)

    return sharded(source, out, change)


def logits(engine) -> torch.Tensor:
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        return engine.model(input_ids=ids).logits


def test_an_adapter_runs_in_memory_as_its_merged_weights_and_comes_off_exactly(checkpoints, tiny_checkpoint, tmp_path):
    cache = ModelCache(SPEC)
    base, base_digests = checkpoints["base"]
    base_logits = logits(cache.get("base", base, base_digests)).clone()
    adapted, adapted_digests, tensors = with_adapter(base, base_digests, tmp_path / "adapted")
    engine = cache.get("adapted", adapted, adapted_digests)
    assert cache.full_loads == 1 and cache.files_applied == 0, "the base stays resident; nothing reloaded"
    reference = ModelCache(SPEC).get("merged", *merged(tiny_checkpoint, tmp_path / "merged", tensors, 4.0 / 2))
    assert torch.allclose(logits(engine), logits(reference), atol=1e-4)
    assert not torch.allclose(logits(engine), base_logits, atol=1e-3), "the adapter changes the model"

    again = cache.get("base", base, base_digests)  # hooks removed: the base exactly, no subtract-back
    assert torch.equal(logits(again), base_logits) and cache.full_loads == 1
    other, other_digests, _ = with_adapter(base, base_digests, tmp_path / "other", seed=1)
    cache.get("other", other, other_digests)
    cache.get("adapted", adapted, adapted_digests)  # switching adapters: one set of hooks at a time
    assert torch.allclose(logits(cache.get("adapted", adapted, adapted_digests)), logits(reference), atol=1e-4)
