"""dump_ucb: UCB over each domain's mean absolute advantage and its sample count (seed 001,
Table 1; DUMP, arXiv 2504.09710).

score(d) = abar_d + c * sqrt(2 ln(N + 1) / (n_d + 1)), abar_d the mean |advantage| of domain d's
last `window` rollouts, n_d its cumulative rollouts, N = sum_d n_d; p = softmax(score / T) with a
floor (DataFlex-RL's DumpUCBMixer: c 1.0, T 1.0, floor 0.05). Departure, on purpose: DataFlex-RL's
mix trainer feeds every mixer the windowed mean *reward* and no counts (its trainer.py passes
`tracker.mean(d)` only), so its dump_ucb ran on reward with an equal bonus; we give it the
signals its paper and DataFlex-RL's Table 1 name (abar_d, n_d). See mixture.py and docs/DATAFLEX.md.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from trainer_node.policies.base import POLICIES
from trainer_node.policies.mixture import AdaptiveMixtureOptions, DomainMixturePolicy, softmax_with_floor


class DumpUcbOptions(AdaptiveMixtureOptions):
    name: Literal["dump_ucb"] = Field(default="dump_ucb", description="UCB over mean |advantage| (DUMP).")
    exploration: float = Field(default=1.0, ge=0, description="c: weight of the UCB exploration bonus.")


def ucb_scores(mean_abs_advantage: np.ndarray, counts: np.ndarray, exploration: float) -> np.ndarray:
    """abar_d + c * sqrt(2 ln(N + 1) / (n_d + 1))."""
    total = counts.sum()
    return mean_abs_advantage + exploration * np.sqrt(2.0 * np.log(total + 1.0) / (counts + 1.0))


@POLICIES.register("dump_ucb", options=DumpUcbOptions)
class DumpUcbMixture(DomainMixturePolicy):
    options: DumpUcbOptions

    def signal(self) -> np.ndarray:
        return ucb_scores(self.stats.mean_abs_advantage(), self.stats.count_array(), self.options.exploration)

    def mix(self, step: int) -> np.ndarray:
        return softmax_with_floor(self.signal(), self.options.temperature, self.options.floor)
