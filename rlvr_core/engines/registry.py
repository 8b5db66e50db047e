"""Generation engines by name: the `ENGINES` registry (protocol.plugins.Registry).

To add an engine:
    @ENGINES.register("mine", options=MineOptions)   # MineOptions: an OptionsSection of its options
    class MyEngine(GenerationEngine): ...   # __init__(model, tokenizer, device="cpu", **options)
and import its module in `_import_builtin_engines` (a plug-in: entry point `target_feedback.engines`,
its options model as the class attribute `Options`). build_engine and the trainer's config
validate the options with that model, so a typo names the option.

Every engine gets the same constructor input, `(model, tokenizer, device, **options)`, and the
same `generate` call, so callers never special-case one: a batch shape the caller needs fixed
(the owner's batch size) travels in `generate(shape=FixedShape(...))`, not as an option only
some engines take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.plugins import Registry, subclass_entries
from rlvr_core.engines.base import GenerationEngine

EngineFactory = Callable[..., GenerationEngine]


def _import_builtin_engines() -> None:
    # Imported on first use, not at the top: engine modules import this registry (no cycles), and
    # vllm_engine imports without vLLM installed (only constructing its engine needs it).
    import rlvr_core.engines.transformers_engine  # registers "transformers"
    import rlvr_core.engines.vllm_engine  # noqa: F401  (registers "vllm")


ENGINES: Registry[EngineFactory] = Registry(
    "engines", _import_builtin_engines, noun="engine",
    on_add=subclass_entries(GenerationEngine, "engine", factories=True),
)


def engine_names() -> list[str]:
    """Registered engine names, sorted."""
    return ENGINES.names()


def build_engine(
    name: str, model: Any, tokenizer: Any, device: str = "cpu", **options: Any
) -> GenerationEngine:
    """Construct the engine registered as `name`; unknown names raise ValueError listing known ones,
    and options are validated by the engine's options model first (a typo names the option)."""
    from rlvr_core.configuration import validate_options

    model_type = ENGINES.options_model(name)
    if model_type is not None:
        options = validate_options(model_type, options, part=f"engine {name!r}").model_dump()
    return ENGINES.get(name)(model, tokenizer, device=device, **options)
