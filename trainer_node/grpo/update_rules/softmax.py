"""softmax: response weights w_gk proportional to exp(a_gk / T), T = 1 (seed 001, Table 1).

As DataFlex-RL's SoftmaxReweighter (temperature 1.0): a softmax over the batch's responses,
rescaled to mean 1 (the seam does that over the kept responses). The maximum is subtracted
before exp, which changes nothing after the rescaling.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import REWEIGHTINGS, ReweightingRule, UpdateInput
from trainer_node.grpo.update_signals import mean_abs_advantage


class SoftmaxOptions(UpdateRuleOptions):
    name: Literal["softmax"] = Field(default="softmax", description="Softmax over |advantage|.")
    temperature: float = Field(default=1.0, gt=0, description="T in w = exp(a / T).")


@REWEIGHTINGS.register("softmax", options=SoftmaxOptions)
class SoftmaxReweighting(ReweightingRule):
    options: SoftmaxOptions

    def weights(self, inputs: UpdateInput) -> torch.Tensor:
        logits = mean_abs_advantage(inputs) / self.options.temperature
        kept = logits[inputs.keep]
        top = kept.max() if kept.numel() else logits.new_zeros(())
        return torch.exp(logits - top)
