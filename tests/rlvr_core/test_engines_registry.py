"""Engine registry and the import-guarded vLLM engine."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from rlvr_core.engines import registry
from rlvr_core.engines.base import GenerationEngine
from rlvr_core.engines.transformers_engine import TransformersEngine
from rlvr_core.models import load_policy, random_tiny_policy


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory):
    path = random_tiny_policy(tmp_path_factory.mktemp("reg") / "model", ["Calculate 1 + 2.\nAnswer: 3"] * 4)
    return load_policy(path)


def test_builtin_engines_are_registered() -> None:
    assert {"transformers", "vllm"} <= set(registry.engine_names())


def test_build_engine_passes_device_and_options(policy) -> None:
    model, tokenizer = policy
    engine = registry.build_engine("transformers", model, tokenizer, device="cpu", batch_size=3)
    assert isinstance(engine, TransformersEngine) and engine.batch_size == 3
    assert isinstance(engine, GenerationEngine)


def test_unknown_engine_lists_known_names(policy) -> None:
    with pytest.raises(ValueError, match="unknown engine 'nope'; known: transformers, vllm"):
        registry.build_engine("nope", *policy)


def test_duplicate_and_foreign_registrations_are_refused() -> None:
    with pytest.raises(ValueError, match="engine 'transformers' is already registered"):
        registry.ENGINES.register("transformers")(TransformersEngine)
    with pytest.raises(TypeError, match="not a subclass of GenerationEngine"):
        registry.ENGINES.copy().register("dict")(dict)


def test_registered_engines_carry_their_registered_name() -> None:
    for entry in registry.ENGINES:
        assert entry.value.name == entry.name


@pytest.mark.parametrize("entry", list(registry.ENGINES), ids=lambda entry: entry.name)
def test_every_engine_takes_the_same_constructor_input(entry) -> None:
    # verl PR #7473's lesson: one input for every entry, so no caller special-cases an engine
    # (the owner's batch size travels in generate(shape=FixedShape(...)), not as an option).
    inspect.signature(entry.value).bind("model", "tokenizer", device="cpu")
    assert "shape" in inspect.signature(entry.value.generate).parameters


def test_an_engine_registers_with_the_registry_decorator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "ENGINES", registry.ENGINES.copy())

    @registry.ENGINES.register("echo")
    class EchoEngine(GenerationEngine):
        def __init__(self, model, tokenizer, device="cpu", **options):
            self.options = options

        def generate(self, prompts, num_samples, params, row_keys=None, shape=None):
            return [[] for _ in prompts]

    engine = registry.build_engine("echo", None, None, flavour="x")
    assert isinstance(engine, EchoEngine) and engine.options == {"flavour": "x"} and engine.name == "echo"
    assert "echo" in registry.engine_names()


def test_vllm_module_imports_without_vllm_and_engine_says_how_to_install(
    policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = importlib.import_module("rlvr_core.engines.vllm_engine")
    assert "unverified" in module.__doc__.lower()
    monkeypatch.setattr(module, "vllm_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"gpu.*extra|extra.*gpu"):
        registry.build_engine("vllm", *policy, device="cuda")


def test_vllm_engine_refuses_cpu_when_installed(policy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    module = importlib.import_module("rlvr_core.engines.vllm_engine")
    monkeypatch.setattr(module, "vllm_available", lambda: True)
    with pytest.raises(ValueError, match="CUDA"):
        module.VLLMEngine(*policy, device="cpu")
