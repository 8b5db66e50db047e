"""Generation engines by name.

To add an engine: write a GenerationEngine subclass whose constructor takes
`(model, tokenizer, device="cpu", **options)` and call `register_engine("name", Class)` (or use
`@register_engine("name")` on the class). Every engine gets the same constructor input, so
callers never special-case one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr_core.engines.base import GenerationEngine

EngineFactory = Callable[..., GenerationEngine]

_ENGINES: dict[str, EngineFactory] = {}


def register_engine(name: str, factory: EngineFactory | None = None) -> Any:
    """Register `factory` under `name`; without a factory, return a class decorator.

    Registering a name twice raises ValueError (a silent override would hide a bug).
    """

    def add(engine_factory: EngineFactory) -> EngineFactory:
        if not name:
            raise ValueError("engine name must be non-empty")
        if name in _ENGINES:
            raise ValueError(f"engine {name!r} is already registered")
        _ENGINES[name] = engine_factory
        return engine_factory

    return add if factory is None else add(factory)


def engine_names() -> list[str]:
    """Registered engine names, sorted."""
    return sorted(_ENGINES)


def build_engine(name: str, model: Any, tokenizer: Any, device: str = "cpu", **options: Any) -> GenerationEngine:
    """Construct the engine registered as `name`; unknown names raise ValueError listing known ones."""
    if name not in _ENGINES:
        raise ValueError(f"unknown engine {name!r}; known engines: {', '.join(engine_names())}")
    return _ENGINES[name](model, tokenizer, device=device, **options)


def _register_builtin_engines() -> None:
    # Imported here, not at the top, so engine modules never import the registry (no cycles).
    # vllm_engine imports without vLLM installed; only constructing its engine needs it.
    from rlvr_core.engines.transformers_engine import TransformersEngine
    from rlvr_core.engines.vllm_engine import VLLMEngine

    register_engine(TransformersEngine.name, TransformersEngine)
    register_engine(VLLMEngine.name, VLLMEngine)


_register_builtin_engines()
