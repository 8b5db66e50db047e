"""Training engines, and what each can offer a data policy, checked when the config loads.

This project's own loop (trainer_node/loop.py) builds lookahead candidates: extra training
passes from the current parameters (L2RR's "lookahead" and "spsa" estimators), and runs every
data policy. An engine that owns its training step (TRL's GRPOTrainer, verl's PPO trainer)
cannot build candidates without a hook into that step, and draws prompts through one index
stream (integrations/core.py): it offers only releases of the model it has just trained
("release_difference") and policies whose draws are a cluster distribution.

Every engine is a `TrainingEngine` registered in TRAINING_ENGINES (`[engine] name = "..."`);
its capabilities are class attributes, and `check_engine_support` refuses a policy that needs
more, naming the option and the fix, before anything runs or is charged. Light on purpose:
trainer_node/config.py imports it at start-up; an engine's own package is imported only in its
`run`, from its pyproject extra.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.plugins import Registry, subclass_entries
from trainer_node.policies.options import PolicyOptions


@dataclass(frozen=True)
class EngineSupport:
    """An engine's capabilities as a data policy sees them."""

    engine: str
    """The engine's name, for messages (its registry name in [engine])."""
    lookahead_candidates: bool
    """It can build lookahead candidates (extra training passes from the current parameters)."""
    any_policy: bool = True
    """It runs every data policy; False: only those that draw from a cluster distribution
    (`DataPolicy.cluster_sampler`), which the engine's shared index stream reproduces."""
    lora: bool = False
    """It trains a `[model.lora]` adapter (trainer_node/lora.py) and sends adapter candidates."""


OWN_LOOP = EngineSupport(engine="trainer_node", lookahead_candidates=True, lora=True)
"""The project's own GRPO loop: every policy and estimator."""


class TrainingEngine(ABC):
    """One way of running the GRPO steps. `run` drives a whole run like trainer_node/loop.py's
    run_loop (same hooks, same LoopResult), so `train` and `simulate` report it the same way."""

    name: ClassVar[str] = ""  # stamped by the registry
    lookahead_candidates: ClassVar[bool] = False
    any_policy: ClassVar[bool] = False
    extra: ClassVar[str | None] = None
    """The pyproject extra that installs it (None: nothing beyond the project)."""
    resumable: ClassVar[bool] = False
    """`train --resume` continues its checkpoints."""
    lora: ClassVar[bool] = False
    """It trains a `[model.lora]` adapter (the PEFT-wrapped model's adapter parameters only)."""

    @classmethod
    def process_rank(cls) -> int:
        """This process's rank in a multi-process launch (0: the only or the main process). Only
        rank 0 writes the run's summary and metrics; another rank keeps its files apart."""
        return 0

    @classmethod
    def support(cls) -> EngineSupport:
        return EngineSupport(engine=cls.name, lookahead_candidates=cls.lookahead_candidates,
                             any_policy=cls.any_policy, lora=cls.lora)

    @abstractmethod
    def run(self, setup: Any, output: Any, schedule: Any, evaluation: Any, hook: Any, feedback: Any) -> Any:
        """Train `setup` (trainer_node.training.TrainingSetup) for schedule.steps; log to `output`
        (RunOutput); measure with `evaluation`; `hook`/`feedback`: the owner's OwnerFeedbackHook and
        OwnerFeedback, or None. Returns a trainer_node.loop.LoopResult."""


def _import_builtin_engines() -> None:
    import trainer_node.integrations.trl  # noqa: F401 - registers "trl" (trl itself is imported on use)


TRAINING_ENGINES: Registry[type[TrainingEngine]] = Registry(
    "training_engines", _import_builtin_engines, noun="training engine",
    on_add=subclass_entries(TrainingEngine, "training engine"),
)
"""Training engines by name; plug-ins through the entry-point group `target_feedback.training_engines`."""


@TRAINING_ENGINES.register("trainer_node")
class OwnLoopEngine(TrainingEngine):
    """This project's own GRPO loop (trainer_node/loop.py): the reference, every policy and estimator."""

    lookahead_candidates = True
    any_policy = True
    resumable = True
    lora = True

    def run(self, setup, output, schedule, evaluation, hook, feedback):
        from trainer_node.loop import run_loop

        return run_loop(setup.trainer, output, schedule, evaluation, hook)


def engine_support(name: str) -> EngineSupport:
    return TRAINING_ENGINES.get(name).support()


def unsupported_reason(policy: PolicyOptions, support: EngineSupport) -> str | None:
    """None when `support` serves `policy`; otherwise the error, naming the field and the fix."""
    if not support.any_policy:
        from trainer_node.policies.base import policy_class

        if not policy_class(policy.name).cluster_sampler:
            return (f"policy.name: {policy.name!r} chooses its prompts itself (rounds, filters, replays), which "
                    f"engine {support.engine!r} cannot follow; use a policy that draws from a cluster "
                    "distribution (l2rr, uniform), or engine.name = 'trainer_node'")
    need = policy.candidate_need()
    if need is None or support.lookahead_candidates:
        return None
    value = getattr(policy, need.field, None)
    return (
        f"policy.{need.field}: {value!r} needs lookahead candidates (extra training passes), which engine "
        f"{support.engine!r} cannot build; {need.fix}"
    )


def check_engine_support(policy: PolicyOptions, support: EngineSupport) -> None:
    """Raise ValueError (the config edge reports it) when the engine cannot serve the policy."""
    reason = unsupported_reason(policy, support)
    if reason is not None:
        raise ValueError(reason)
