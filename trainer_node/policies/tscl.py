"""tscl: favour domains with learning progress (seed 001, Table 1; Teacher-Student Curriculum
Learning, arXiv 1707.00183).

Progress s_d = |slope| of domain d's reward curve: the least-squares slope of its per-step mean
reward over the last `slope_window` steps it was sampled in (rising and falling reward both
count, as in TSCL); p = softmax(s / T) with a floor (DataFlex-RL's TSCLMixer: T 1.0, floor 0.05,
unsigned). Departures: DataFlex-RL's tracker fits the slope over the last 50 *rollouts* in
arrival order, and its mix trainer actually passes the windowed mean reward, not the slope, to
every mixer (trainer.py); we use per-step means (a curve over training, ours: 10 steps) and the
slope the method is defined by. See mixture.py and docs/DATAFLEX.md.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from trainer_node.policies.base import POLICIES
from trainer_node.policies.mixture import AdaptiveMixtureOptions, DomainMixturePolicy, softmax_with_floor


class TsclOptions(AdaptiveMixtureOptions):
    name: Literal["tscl"] = Field(default="tscl", description="Favour domains whose reward changes fastest.")
    slope_window: int = Field(default=10, ge=2, le=50, description="Per-step reward means the slope is fitted over.")
    signed: bool = Field(default=False, description="True: only rising reward counts (max(slope, 0)).")


@POLICIES.register("tscl", options=TsclOptions)
class TsclMixture(DomainMixturePolicy):
    options: TsclOptions

    def signal(self) -> np.ndarray:
        slopes = self.stats.reward_slope(self.options.slope_window)
        return np.maximum(slopes, 0.0) if self.options.signed else np.abs(slopes)

    def mix(self, step: int) -> np.ndarray:
        return softmax_with_floor(self.signal(), self.options.temperature, self.options.floor)
