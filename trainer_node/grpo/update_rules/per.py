"""per: response weights w_gk proportional to (a_gk + eps)^0.5 (seed 001, Table 1; prioritised
experience replay's priority exponent, arXiv 1511.05952, on the mean absolute advantage).

As DataFlex-RL's PERAdvantageReweighter (alpha 0.5, eps 1e-8), rescaled by the seam to mean 1
over the kept responses. Zero-advantage responses (zero-variance groups) get a weight near 0,
which changes nothing: their loss is 0 anyway.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import REWEIGHTINGS, ReweightingRule, UpdateInput
from trainer_node.grpo.update_signals import mean_abs_advantage


class PerOptions(UpdateRuleOptions):
    name: Literal["per"] = Field(default="per", description="PER-style priority on |advantage|.")
    alpha: float = Field(default=0.5, ge=0, description="Priority exponent: w = (a + eps)^alpha.")
    eps: float = Field(default=1e-8, gt=0, description="Added to a before the power.")


@REWEIGHTINGS.register("per", options=PerOptions)
class PrioritisedReweighting(ReweightingRule):
    options: PerOptions

    def weights(self, inputs: UpdateInput) -> torch.Tensor:
        return (mean_abs_advantage(inputs) + self.options.eps) ** self.options.alpha
