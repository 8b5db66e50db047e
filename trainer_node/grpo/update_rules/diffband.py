"""diffband: 2x weight for responses whose reward lies between the batch's reward quartiles
(seed 001, Table 1).

As DataFlex-RL's DifficultyBandReweighter run with its defaults (low_q 0.25, high_q 0.75,
focus_weight 2.0, the reward_difficulty scorer): q1, q3 are torch.quantile's (linear
interpolation) over the batch's rewards (ours: over the kept responses when a selection rule
runs too), the band is closed [q1, q3], weights are rescaled to mean 1. With 0/1 rewards the
band is often every response (q1 = 0, q3 = 1: the identity) or only the majority value.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import REWEIGHTINGS, ReweightingRule, UpdateInput


class DiffBandOptions(UpdateRuleOptions):
    name: Literal["diffband"] = Field(default="diffband", description="Reward-quartile band up-weighting.")
    low_q: float = Field(default=0.25, ge=0, le=1, description="Lower quantile of the band.")
    high_q: float = Field(default=0.75, ge=0, le=1, description="Upper quantile of the band (>= low_q).")
    focus_weight: float = Field(default=2.0, gt=0, description="Weight inside the band (1 outside).")

    @field_validator("high_q")
    @classmethod
    def _above_low(cls, value: float, info: ValidationInfo) -> float:
        low = info.data.get("low_q")
        if low is not None and value < low:
            raise ValueError(f"must be >= low_q ({low}), got {value}")
        return value


@REWEIGHTINGS.register("diffband", options=DiffBandOptions)
class DifficultyBand(ReweightingRule):
    options: DiffBandOptions

    def weights(self, inputs: UpdateInput) -> torch.Tensor:
        rewards = inputs.rewards.to(torch.float64)
        kept = rewards[inputs.keep]
        weights = torch.ones_like(rewards)
        if kept.numel() <= 1:
            return weights
        q1 = torch.quantile(kept, self.options.low_q)
        q3 = torch.quantile(kept, self.options.high_q)
        weights[(rewards >= q1) & (rewards <= q3)] = self.options.focus_weight
        return weights
