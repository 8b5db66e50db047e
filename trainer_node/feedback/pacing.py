"""Budget pacing: spread the owner's remaining privacy budget over the remaining steps.

After every release the owner reports what it cost and what is left. Under RDP composition
later releases cost no more than earlier ones, so dividing the remaining budget by the last
observed cost is a conservative estimate of the queries left. The pacer then queries every
ceil(steps_left / queries_left) steps, so the budget lasts the whole run instead of being
spent in the first steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class BudgetPacer:
    total_steps: int
    min_interval: int = 1           # never query more often than this
    first_step: int = 0             # the first query happens at this step
    reserve_queries: int = 0        # releases kept back (e.g. for final checkpoint selection)
    dp_enabled: bool = True
    next_step: int = 0
    exhausted: bool = False

    def __post_init__(self) -> None:
        if self.total_steps < 1 or self.min_interval < 1:
            raise ValueError("BudgetPacer: total_steps and min_interval must be >= 1")
        self.next_step = self.first_step

    def should_query(self, step: int) -> bool:
        return not self.exhausted and step >= self.next_step

    def record(self, step: int, epsilon_this_release: float, epsilon_remaining: float) -> int:
        """Plan the next query after a release at `step`; returns the planned interval."""
        interval = self.min_interval
        if self.dp_enabled and epsilon_this_release > 0:
            queries_left = math.floor(epsilon_remaining / epsilon_this_release) - self.reserve_queries
            if queries_left <= 0:
                self.exhausted = True
                return 0
            steps_left = max(self.total_steps - step - 1, 1)
            interval = max(self.min_interval, math.ceil(steps_left / queries_left))
        self.next_step = step + interval
        return interval

    def mark_exhausted(self) -> None:
        self.exhausted = True

    def state_dict(self) -> dict:
        return {"next_step": self.next_step, "exhausted": self.exhausted}

    def load_state_dict(self, state: dict) -> None:
        self.next_step = int(state["next_step"])
        self.exhausted = bool(state["exhausted"])
