"""The worker builds every engine from the same input; the batch size reaches it as a FixedShape."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rlvr_core.engines import registry
from rlvr_core.engines.base import GenerationEngine
from rlvr_core.engines.transformers_engine import TransformersEngine
from target_owner_node.worker import ModelCache, WorkerSpec, evaluation_shape

SPEC = WorkerSpec(
    heldout_path=Path("unused.jsonl"),
    test_path=None,
    verifier="exact_match",
    prompt_template="{prompt}",
    engine="transformers",
    device="cpu",
    dtype="float32",
    batch_size=5,
    model_cache_size=2,
    max_prompt_tokens=16,
)


def test_every_engine_gets_the_same_constructor_input(tiny_checkpoint, monkeypatch):
    scratch = registry.ENGINES.copy()
    monkeypatch.setattr(registry, "ENGINES", scratch)
    built = []

    @scratch.register("recording")
    class RecordingEngine(GenerationEngine):
        def __init__(self, model, tokenizer, device="cpu", **options):
            built.append((device, options))
            self.model = model

        def generate(self, prompts, num_samples, params, row_keys=None, shape=None):
            return [[] for _ in prompts]

    engines = {name: ModelCache(replace(SPEC, engine=name)).get("ckpt", tiny_checkpoint)
               for name in ("transformers", "recording")}
    assert isinstance(engines["transformers"], TransformersEngine)
    assert built == [("cpu", {})], "no engine gets options another engine does not"
    for engine in engines.values():  # the owner's batch size is the shape of every generate call
        shape = evaluation_shape(SPEC, engine, max_new_tokens=4)
        assert (shape.batch_prompts, shape.prompt_tokens) == (5, 16)
