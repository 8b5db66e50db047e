"""Uniform GRPO: B prompts drawn uniformly without replacement, n rollouts each."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer_node.policies.base import (
    DataPolicy,
    PolicySettings,
    RolloutRequest,
    SourcePool,
    StepRollouts,
    parse_options,
    register_policy,
)


@dataclass(frozen=True)
class UniformOptions:
    """Uniform takes no options; any key is a typo and is rejected."""


@register_policy
class UniformPolicy(DataPolicy):
    name = "uniform"

    def __init__(self, pool: SourcePool, settings: PolicySettings, rng: np.random.Generator):
        super().__init__(pool, settings, rng)
        self.options = parse_options(self.name, UniformOptions, settings.options)

    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        if so_far.rounds > 0:
            return []
        size = min(self.settings.batch_size, len(self.pool))
        indices = self.rng.choice(len(self.pool), size=size, replace=False)
        return [RolloutRequest(int(i), self.settings.rollouts_per_prompt) for i in indices]
