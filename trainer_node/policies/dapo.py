"""DAPO dynamic sampling (verl-recipe `dapo/`, filter_groups).

Each generation round draws `gen_batch_size = ceil(batch_size * gen_batch_multiplier)`
prompts uniformly (without replacement, never a prompt already rolled out this step, so a
group is never silently extended), rolls out n responses each, and keeps the groups whose
rewards are not all equal (std > 0). Rounds accumulate until `batch_size` groups are kept
or `max_num_gen_batches` rounds have run; the training batch is the first `batch_size`
kept groups in generation order, as verl slices `batch[:train_batch_size * n]`.

Deviation from verl: verl raises when the cap is hit with too few kept groups. A run here
must not die on one unlucky step, so we train on what we have and count the event
(`cap_hit`, `cap_hits_total`) so it shows in the logs.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import Field

from trainer_node.policies.base import (
    POLICIES,
    DataPolicy,
    Group,
    RolloutRequest,
    SourcePool,
    StepRollouts,
    informative_groups,
    sample_fresh_uniform,
)
from trainer_node.policies.options import PolicyOptions


class DapoOptions(PolicyOptions):
    name: Literal["dapo"] = Field(default="dapo", description="DAPO dynamic sampling (filter_groups).")
    gen_batch_multiplier: float = Field(
        default=1.0, gt=0, description="Prompts per generation round = ceil(batch_size * this)."
    )
    max_num_gen_batches: int = Field(
        default=4, ge=1, description="Generation rounds per step before training on what was kept."
    )


@POLICIES.register("dapo", options=DapoOptions)
class DapoPolicy(DataPolicy):
    options: DapoOptions

    def __init__(self, pool: SourcePool, options: DapoOptions, rng: np.random.Generator):
        super().__init__(pool, options, rng)
        self.gen_batch_size = max(1, math.ceil(options.batch_size * options.gen_batch_multiplier))
        self.cap_hits_total = 0
        self._step_metrics: dict[str, float] = {}

    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        if so_far.rounds > 0:
            kept = len(informative_groups(so_far.groups))
            if kept >= self.options.batch_size or so_far.rounds >= self.options.max_num_gen_batches:
                return []
        seen = {g.index for g in so_far.groups}
        indices = sample_fresh_uniform(self.rng, len(self.pool), self.gen_batch_size, seen)
        return [RolloutRequest(i, self.options.rollouts_per_prompt) for i in indices]

    def training_groups(self, step: int, so_far: StepRollouts) -> list[Group]:
        kept = informative_groups(so_far.groups)
        cap_hit = len(kept) < self.options.batch_size
        self.cap_hits_total += int(cap_hit)
        total = max(len(so_far.groups), 1)
        self._step_metrics = {
            "rounds": float(so_far.rounds),
            "kept_groups": float(min(len(kept), self.options.batch_size)),
            "zero_variance_frac": float(sum(g.zero_variance for g in so_far.groups) / total),
            "rollouts_generated": float(so_far.rollouts_generated),
            "cap_hit": float(cap_hit),
            "cap_hits_total": float(self.cap_hits_total),
        }
        return kept[: self.options.batch_size]

    def state_dict(self) -> dict[str, Any]:
        return {"cap_hits_total": self.cap_hits_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cap_hits_total = int(state["cap_hits_total"])

    def metrics(self) -> dict[str, float]:
        return dict(self._step_metrics)
