"""difffilter: keep a group iff 0.2 < q_g < 0.8 (seed 001, Table 1; DAPO-style solve-rate filtering).

q_g = (1/K) sum_k 1[r_gk > 0.5] (the group solve rate). Every response of a group outside the
band is masked. Constants from DataFlex-RL's run scripts (experiments/gen_jobs.sh: the
group_solve_rate scorer with success_threshold 0.5, threshold_band low 0.2, high 0.8, strict
inequalities). With K = 5, q takes the values 0, .2, .4, .6, .8, 1: only groups with 2 or 3
correct responses of 5 stay.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import SELECTIONS, SelectionRule, UpdateInput
from trainer_node.grpo.update_signals import group_solve_rate


class DiffFilterOptions(UpdateRuleOptions):
    name: Literal["difffilter"] = Field(default="difffilter", description="Solve-rate band filter.")
    low: float = Field(default=0.2, ge=0, le=1, description="Keep a group only if its solve rate is > low.")
    high: float = Field(default=0.8, ge=0, le=1, description="... and < high (> low).")
    success_threshold: float = Field(default=0.5, description="A response is solved when its reward is > this.")

    @field_validator("high")
    @classmethod
    def _above_low(cls, value: float, info: ValidationInfo) -> float:
        low = info.data.get("low")
        if low is not None and not value > low:
            raise ValueError(f"must be > low ({low}), got {value}")
        return value


@SELECTIONS.register("difffilter", options=DiffFilterOptions)
class DiffFilter(SelectionRule):
    options: DiffFilterOptions

    def keep(self, inputs: UpdateInput) -> torch.Tensor:
        q = group_solve_rate(inputs, self.options.success_threshold)
        return (q > self.options.low) & (q < self.options.high)
