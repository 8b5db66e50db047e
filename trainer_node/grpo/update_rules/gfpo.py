"""gfpo: keep the top 3 of the K = 5 responses of each group by r/L (seed 001, Table 1; Group
Filtered Policy Optimization, arXiv 2508.09726).

As DataFlex-RL runs it (experiments/gen_jobs.sh: gfpo with k = 3, metric "efficiency"): the
score is reward / completion length (length clamped to 1), groups of at most k responses keep
all of them, and advantages are those of the whole group, computed before the mask (the seam
order). GFPO's paper recomputes advantages over the retained subset; DataFlex-RL does not,
and neither do we. Ties (equal r/L) are broken by rollout order (ours: torch.topk's order is
unspecified).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import SELECTIONS, SelectionRule, UpdateInput
from trainer_node.grpo.update_signals import efficiency


class GfpoOptions(UpdateRuleOptions):
    name: Literal["gfpo"] = Field(default="gfpo", description="GFPO: top-k responses of each group.")
    keep: int = Field(default=3, ge=1, description="Responses kept per group (k).")
    metric: Literal["efficiency", "short"] = Field(
        default="efficiency", description="'efficiency': highest reward / length; 'short': shortest responses."
    )


@SELECTIONS.register("gfpo", options=GfpoOptions)
class Gfpo(SelectionRule):
    options: GfpoOptions

    def keep(self, inputs: UpdateInput) -> torch.Tensor:
        score = efficiency(inputs) if self.options.metric == "efficiency" else -inputs.lengths.to(torch.float64)
        keep = torch.zeros(inputs.size, dtype=torch.bool, device=inputs.rewards.device)
        for rows in inputs.groups():
            order = torch.argsort(score[rows], descending=True, stable=True)
            keep[rows[order[: self.options.keep]]] = True
        return keep
