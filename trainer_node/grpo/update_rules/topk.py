"""topk: keep the top 50% of the batch's responses by mean absolute advantage a_gk (seed 001,
Table 1).

As DataFlex-RL runs it (experiments/gen_jobs.sh: the advantage_magnitude scorer, mean over
tokens, with topk_fraction 0.5): the ranking is over the whole batch, not within groups, and
k = max(1, round(fraction * N)) with Python's round. Zero-variance groups have a = 0, so they
go first. Ties are broken by rollout order (ours: torch.topk's order is unspecified).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import SELECTIONS, SelectionRule, UpdateInput
from trainer_node.grpo.update_signals import mean_abs_advantage


class TopKOptions(UpdateRuleOptions):
    name: Literal["topk"] = Field(default="topk", description="Top share of responses by |advantage|.")
    fraction: float = Field(default=0.5, gt=0, le=1, description="Share of the batch's responses kept.")


@SELECTIONS.register("topk", options=TopKOptions)
class TopK(SelectionRule):
    options: TopKOptions

    def keep(self, inputs: UpdateInput) -> torch.Tensor:
        count = max(1, round(self.options.fraction * inputs.size))
        order = torch.argsort(mean_abs_advantage(inputs), descending=True, stable=True)
        keep = torch.zeros(inputs.size, dtype=torch.bool, device=inputs.rewards.device)
        keep[order[:count]] = True
        return keep
