"""What a training engine can offer a data policy, checked when the config loads.

This project's own loop (trainer_node/loop.py) builds lookahead candidates: extra training
passes from the current parameters (L2RR's "lookahead" and "spsa" estimators). An engine that
owns its training step (TRL's GRPOTrainer, verl's PPO trainer) cannot, without a hook into
that step; it offers only releases of the model it has just trained ("release_difference").
An adapter declares its EngineSupport, and `check_engine_support` refuses a policy that needs
more, naming the option and the fix, before anything runs or is charged.

Light on purpose (dataclasses only): trainer_node/config.py may import it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer_node.policies.options import PolicyOptions


@dataclass(frozen=True)
class EngineSupport:
    """An engine's capabilities as a data policy sees them."""

    engine: str
    """The engine's name, for messages (its registry name in [engine])."""
    lookahead_candidates: bool
    """It can build lookahead candidates (extra training passes from the current parameters)."""


OWN_LOOP = EngineSupport(engine="trainer_node", lookahead_candidates=True)
"""The project's own GRPO loop: every estimator."""


def unsupported_reason(policy: PolicyOptions, support: EngineSupport) -> str | None:
    """None when `support` serves `policy`; otherwise the error, naming the field and the fix."""
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
