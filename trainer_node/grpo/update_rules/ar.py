"""ar: token weights w_gkl proportional to 0.5 * pi_gkl + 0.5 (seed 001, Table 1; Advantage
Reweighting, arXiv 2505.12929).

pi_gkl is the probability the rollout policy gave token l (exp of its log-probability, one
no-grad forward pass of the current policy, which on-policy is the rollout policy). Low-
probability tokens, whose gradients are largest, are damped towards 0.5. DataFlex-RL's
AdvantageReweighter (alpha 0.5) uses verl's old_log_probs; the seam rescales the weights to mean
1 over the kept completion tokens, as it does.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field

from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import REWEIGHTINGS, ReweightingRule, UpdateInput
from trainer_node.grpo.update_signals import token_probabilities


class ArOptions(UpdateRuleOptions):
    name: Literal["ar"] = Field(default="ar", description="Advantage Reweighting (token probability).")
    alpha: float = Field(default=0.5, ge=0, le=1, description="w = alpha * pi + (1 - alpha).")


@REWEIGHTINGS.register("ar", options=ArOptions)
class AdvantageReweighting(ReweightingRule):
    options: ArOptions
    requires: ClassVar[frozenset[str]] = frozenset({"token_logprobs"})

    def weights(self, inputs: UpdateInput) -> torch.Tensor:
        alpha = self.options.alpha
        return alpha * token_probabilities(inputs) + (1.0 - alpha)
