"""reward_gap: favour lagging domains (seed 001, Table 1).

p(d) = softmax((max_d' rbar_d' - rbar_d) / T) with a floor, rbar_d the mean reward of domain d's
last `window` rollouts: a domain the policy already solves gets less, one it lags on gets more
(DataFlex-RL's RewardGapMixer, T 1.0, floor 0.05, window 50, updated every step after a
one-step warm-up: experiments/gen_jobs_mix.sh). See mixture.py.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from trainer_node.policies.base import POLICIES
from trainer_node.policies.mixture import AdaptiveMixtureOptions, DomainMixturePolicy, softmax_with_floor


class RewardGapOptions(AdaptiveMixtureOptions):
    name: Literal["reward_gap"] = Field(default="reward_gap", description="Favour domains with lower reward.")


@POLICIES.register("reward_gap", options=RewardGapOptions)
class RewardGapMixture(DomainMixturePolicy):
    options: RewardGapOptions

    def signal(self) -> np.ndarray:
        return self.stats.mean_reward()

    def mix(self, step: int) -> np.ndarray:
        means = self.signal()
        return softmax_with_floor(means.max() - means, self.options.temperature, self.options.floor)
