"""Uniform GRPO: B prompts drawn uniformly without replacement, n rollouts each."""

from __future__ import annotations

from trainer_node.policies.base import DataPolicy, RolloutRequest, StepRollouts, register_policy


@register_policy
class UniformPolicy(DataPolicy):
    name = "uniform"

    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        if so_far.rounds > 0:
            return []
        size = min(self.settings.batch_size, len(self.pool))
        indices = self.rng.choice(len(self.pool), size=size, replace=False)
        return [RolloutRequest(int(i), self.settings.rollouts_per_prompt) for i in indices]
