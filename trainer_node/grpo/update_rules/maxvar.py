"""maxvar: keep the response subset of each group that maximises reward variance (seed 001,
Table 1; PODS max-variance down-sampling, arXiv 2504.13818).

Each group of G responses keeps n = max(1, round(keep_fraction * G)) of them. PODS shows the
optimum takes the a lowest and n - a highest rewards for some a, so a scan over a = 0..n finds
it. As in DataFlex-RL's MaxVarianceSelector (src/dataflex_verl/selectors.py, run with
keep_fraction 0.5): round() is Python's (half to even: 0.5 * 5 = 2.5 -> 2 of 5 kept), rewards
are sorted ascending with ties in rollout order, the variance is the population variance, and
the first a reaching the maximum wins (a = 0: the n highest).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import SELECTIONS, SelectionRule, UpdateInput


class MaxVarOptions(UpdateRuleOptions):
    name: Literal["maxvar"] = Field(default="maxvar", description="PODS max-variance down-sampling.")
    keep_fraction: float = Field(
        default=0.5, gt=0, le=1, description="Share of each group kept: n = max(1, round(keep_fraction * G))."
    )


def max_variance_subset(rewards: list[float], keep: int) -> list[int]:
    """Positions (in `rewards`) of the size-`keep` subset with the largest reward variance."""
    size = len(rewards)
    if keep >= size:
        return list(range(size))
    order = sorted(range(size), key=lambda i: rewards[i])  # stable: ties keep rollout order
    best_variance, best_low = -1.0, 0
    for low in range(keep + 1):
        chosen = [rewards[i] for i in order[:low] + order[size - (keep - low):]]
        mean = sum(chosen) / keep
        variance = sum((r - mean) ** 2 for r in chosen) / keep
        if variance > best_variance:
            best_variance, best_low = variance, low
    return sorted(order[:best_low] + order[size - (keep - best_low):])


@SELECTIONS.register("maxvar", options=MaxVarOptions)
class MaxVar(SelectionRule):
    options: MaxVarOptions

    def keep(self, inputs: UpdateInput) -> torch.Tensor:
        keep = torch.zeros(inputs.size, dtype=torch.bool, device=inputs.rewards.device)
        for rows in inputs.groups():
            count = max(1, round(self.options.keep_fraction * len(rows)))
            chosen = max_variance_subset(inputs.rewards[rows].tolist(), count)
            keep[rows[chosen]] = True
        return keep
