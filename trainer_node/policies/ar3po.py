"""AR3PO: staged adaptive rollout plus response reuse (arXiv 2509.25808; no public code).

Adaptive rollout: `batch_size` prompts are drawn uniformly. Stage 1 gives each
`stage_rollouts` responses. After every stage, a prompt that has no correct response yet
(reward >= correct_threshold) gets another stage, until it has `max_rollouts` responses.
A prompt stops as soon as it has >= 1 correct response: stage_rollouts >= 2 guarantees every
group has at least two responses, so its reward variance is defined. All-correct groups
stop too: more responses on an easy prompt are the cost AR3PO sets out to save.

Response reuse: a replay buffer keeps, per prompt index, the latest correct response ever
generated for it (updated in observe(), i.e. after this step's reuse). A group that ends the
step with no correct response gets one buffered response appended as Rollout(reused=True),
so it has reward variance. Reused responses were sampled from an older policy; the paper
accepts that off-policyness. Only generated responses are spent (Group.generated).

Training batch: every group that has reward variance after reuse. Zero-variance groups
(all-correct, or all-wrong with nothing to reuse) carry zero GRPO advantage; dropping them
only keeps them out of the loss normaliser, as DAPO and L2RR do here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from trainer_node.policies.base import (
    POLICIES,
    DataPolicy,
    Group,
    Rollout,
    RolloutRequest,
    SourcePool,
    StepRollouts,
    sample_fresh_uniform,
)
from trainer_node.policies.options import PolicyOptions


class Ar3poOptions(PolicyOptions):
    name: Literal["ar3po"] = Field(default="ar3po", description="AR3PO staged rollout plus response reuse.")
    stage_rollouts: int = Field(
        default=2, ge=2, description="Responses per prompt per stage (>= 2: a group needs two rewards)."
    )
    max_rollouts: int | None = Field(
        default=None, description="Responses per prompt at most (>= stage_rollouts); None = "
        "rollouts_per_prompt."
    )
    correct_threshold: float = Field(
        default=0.5, gt=0, le=1, description="A reward >= this counts as correct (rewards: 1 right, 0 wrong)."
    )

    @field_validator("max_rollouts")
    @classmethod
    def _at_least_one_stage(cls, value: int | None, info: ValidationInfo) -> int | None:
        stage = info.data.get("stage_rollouts")
        if value is not None and stage is not None and value < stage:
            raise ValueError(f"must be >= stage_rollouts ({stage}), got {value}")
        return value


@POLICIES.register("ar3po", options=Ar3poOptions)
class Ar3poPolicy(DataPolicy):
    options: Ar3poOptions

    def __init__(self, pool: SourcePool, options: Ar3poOptions, rng: np.random.Generator):
        super().__init__(pool, options, rng)
        self.max_rollouts = options.max_rollouts or max(options.rollouts_per_prompt, options.stage_rollouts)
        self.buffer: dict[int, Rollout] = {}  # prompt index -> latest generated correct response
        self._step_metrics: dict[str, float] = {}

    def is_correct(self, rollout: Rollout) -> bool:
        return rollout.reward >= self.options.correct_threshold

    def has_correct(self, group: Group) -> bool:
        return any(self.is_correct(r) for r in group.rollouts if not r.reused)

    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        stage = self.options.stage_rollouts
        if so_far.rounds == 0:
            indices = sample_fresh_uniform(self.rng, len(self.pool), self.options.batch_size, set())
            return [RolloutRequest(i, min(stage, self.max_rollouts)) for i in indices]
        requests = []
        for group in so_far.groups:
            remaining = self.max_rollouts - group.generated
            if remaining > 0 and not self.has_correct(group):
                requests.append(RolloutRequest(group.index, min(stage, remaining)))
        return requests

    def training_groups(self, step: int, so_far: StepRollouts) -> list[Group]:
        batch: list[Group] = []
        reused = 0
        for group in so_far.groups:
            if not self.has_correct(group) and group.index in self.buffer:
                replayed = replace(self.buffer[group.index], reused=True)
                group = Group(
                    group.index, group.cluster, [*group.rollouts, replayed]
                )  # so_far stays as generated
                reused += 1
            if not group.zero_variance:
                batch.append(group)
        prompts = max(len(so_far.groups), 1)
        self._step_metrics = {
            "stages": float(so_far.rounds),
            "rollouts_generated": float(so_far.rollouts_generated),
            "rollouts_per_prompt": so_far.rollouts_generated / prompts,
            "reused": float(reused),
            "kept_groups": float(len(batch)),
            "zero_variance_frac": float(sum(g.zero_variance for g in so_far.groups) / prompts),
        }
        return batch

    def observe(self, step: int, groups: Sequence[Group]) -> None:
        for group in groups:
            correct = [r for r in group.rollouts if not r.reused and self.is_correct(r)]
            if correct:
                self.buffer[group.index] = replace(correct[-1], reused=False)
        self._step_metrics["buffer_size"] = float(len(self.buffer))

    def state_dict(self) -> dict[str, Any]:
        return {
            "buffer": {
                str(index): {
                    "text": r.text,
                    "reward": r.reward,
                    "prompt_ids": list(r.prompt_ids),
                    "completion_ids": list(r.completion_ids),
                }
                for index, r in sorted(self.buffer.items())
            }
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        buffer = {}
        for key, item in state["buffer"].items():
            index = int(key)
            if not 0 <= index < len(self.pool):
                raise ValueError(
                    f"ar3po state: buffered prompt index {index} is outside the pool of {len(self.pool)}"
                )
            buffer[index] = Rollout(
                text=str(item["text"]),
                reward=float(item["reward"]),
                prompt_ids=tuple(int(t) for t in item["prompt_ids"]),
                completion_ids=tuple(int(t) for t in item["completion_ids"]),
            )
        self.buffer = buffer

    def metrics(self) -> dict[str, float]:
        return dict(self._step_metrics)
