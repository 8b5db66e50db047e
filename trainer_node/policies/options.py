"""The typed options every data policy takes: the `[policy]` table of a run config.

Each policy module defines `class XOptions(PolicyOptions)` with `name: Literal["x"] = "x"` and
its own fields (bounds and a description on each), and registers its class with it:
`@POLICIES.register("x", options=XOptions)`. The run config's `[policy]` table is validated
against the model registered under its `name` when the config loads, so

    [policy]
    name = "l2rr"
    batch_size = 8
    lamda_waste = 0.25     # typo

fails at load with `policy.lamda_waste: not an option of data policy 'l2rr'; did you mean
'lambda_waste'? ...`, and resolved_config.json lists every option with the value used.

Light on purpose (pydantic only): trainer_node/config.py imports it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from rlvr_core.configuration import OptionsSection

DEFAULT_POLICY = "uniform"


@dataclass(frozen=True)
class CandidateNeed:
    """Why these options need lookahead candidates (extra training passes of the engine)."""

    field: str
    """The option, inside [policy], that asks for them (L2RR: estimator)."""
    fix: str
    """What to set instead, in words."""


class PolicyOptions(OptionsSection):
    """The batch shape every data policy shares; each policy's options model extends it."""

    sweep_parameter: ClassVar[str | None] = None
    """The option a bench `sweep` group varies (L2RR: lambda_waste); None: no sweep."""

    def sweep_value(self) -> float | None:
        """The effective value of `sweep_parameter` in these options (None without one)."""
        return None

    def candidate_need(self) -> CandidateNeed | None:
        """None when these options need no lookahead candidates from the engine; an engine that cannot
        build them (TRL, verl) refuses the config at load (trainer_node/integrations/support.py)."""
        return None

    name: str = Field(default=DEFAULT_POLICY, description="A registered data policy (trainer_node.policies).")
    batch_size: int = Field(default=8, gt=0, description="Prompts per training batch (B).")
    rollouts_per_prompt: int = Field(
        default=16, ge=2, description="Rollouts per prompt (n); GRPO needs at least 2 to compare."
    )
