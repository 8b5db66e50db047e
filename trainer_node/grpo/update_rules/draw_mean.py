"""draw_mean: GRPO on the mean of several grader draws' coefficients, the baseline SetGRPO's
point coefficients are measured against (issue 19, docs/SETGRPO.md).

Per group: m = mean over the first `draws` draws j of standardise(s_j), GRPO's coefficients of each
draw, averaged. Every group trains (no calibration, no held-back groups, no gate). With draws = 2 it
is what SetGRPO trains a not-yet-calibrated group, and under `rejected = "point"` a rejected one, on;
so SetGRPO minus draw_mean is what the set, the recovery and the gate add, and draw_mean minus GRPO
is what a second grader draw adds. draws = 1 is GRPO's own coefficients.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from trainer_node.grpo import setgrpo as sg
from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import COEFFICIENTS, CoefficientRule, Coefficients, UpdateInput


class DrawMeanOptions(UpdateRuleOptions):
    name: Literal["draw_mean"] = Field(default="draw_mean", description="GRPO on the mean of several grader "
                                       "draws' coefficients (SetGRPO's point coefficients, ungated).")
    draws: int = Field(default=2, ge=1, le=32, description="Grader draws per rollout whose coefficients are "
                       "averaged (the grader is asked for this many).")
    eps: float = Field(default=1e-6, gt=0.0, description="Added to each group's score std (as SetGRPO).")


@COEFFICIENTS.register("draw_mean", options=DrawMeanOptions)
class DrawMean(CoefficientRule):
    options: DrawMeanOptions
    requires = frozenset({"grader_scores"})

    def __init__(self, options: DrawMeanOptions):
        super().__init__(options)
        self.grader_draws = options.draws

    def coefficients(self, inputs: UpdateInput) -> Coefficients:
        scores = inputs.grader_scores
        if scores is None or scores.shape[1] < self.grader_draws:
            raise ValueError(f"draw_mean needs {self.grader_draws} grader draws per rollout")
        advantages = inputs.advantages.to(torch.float64).clone()
        keep = torch.ones(inputs.size, dtype=torch.bool, device=inputs.keep.device)
        for rows in inputs.groups():
            if not rows.numel():
                continue
            mean = torch.stack([sg.standardise(scores[rows, j], self.options.eps)
                                for j in range(self.grader_draws)]).mean(dim=0)
            advantages[rows] = mean
            if float(mean.abs().sum()) == 0:  # no spread in any draw: no update (as SetGRPO)
                keep[rows] = False
        return Coefficients(advantages=advantages.to(inputs.advantages.dtype), keep=keep)
