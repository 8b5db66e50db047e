"""Uniform GRPO: B prompts drawn uniformly without replacement, n rollouts each."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer_node.policies.base import POLICIES, DataPolicy, RolloutRequest, StepRollouts
from trainer_node.policies.options import PolicyOptions


class UniformOptions(PolicyOptions):
    """Uniform takes only the shared batch shape; any other key is a typo and is rejected."""

    name: Literal["uniform"] = Field(default="uniform", description="Uniform GRPO sampling.")


@POLICIES.register("uniform", options=UniformOptions)
class UniformPolicy(DataPolicy):
    cluster_sampler = True  # uniform over prompts = clusters by their share of the pool
    options: UniformOptions

    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        if so_far.rounds > 0:
            return []
        size = min(self.options.batch_size, len(self.pool))
        indices = self.rng.choice(len(self.pool), size=size, replace=False)
        return [RolloutRequest(int(i), self.options.rollouts_per_prompt) for i in indices]
