"""Checkpoint selection by target feedback (the L2RR paper's Table 12), for any data policy.

During training the live model is uploaded as a candidate every `every` steps and at the
end. After training ONE multi-candidate release on the owner's feedback split (same secret
subsample and decoding seed for every candidate, DP-noised like any release) picks the
candidate with the highest released accuracy. The choice uses only what the owner releases;
the simulation then measures the chosen checkpoint on the test split, which is never used
for learning or selection.

Thinning keeps the candidate count within the owner's per-query cap: evenly spaced over the
run, the final model always included.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer_node.feedback.client import FeedbackError

log = logging.getLogger("trainer_node.selection")


@dataclass(frozen=True)
class Candidate:
    step: int
    checkpoint_id: str


@dataclass(frozen=True)
class SelectionResult:
    candidates: tuple[Candidate, ...]
    released_accuracy: tuple[float, ...]  # what the owner released, one per candidate
    chosen: Candidate

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate_steps": [c.step for c in self.candidates],
            "released_accuracy": list(self.released_accuracy),
            "selected_step": self.chosen.step,
        }


def thin(candidates: list[Candidate], limit: int) -> list[Candidate]:
    """At most `limit` candidates, evenly spaced, the last one always kept."""
    if len(candidates) <= limit:
        return list(candidates)
    positions = np.linspace(0, len(candidates) - 1, num=limit).round().astype(int)
    return [candidates[i] for i in sorted(set(positions.tolist()))]


def choose(candidates: list[Candidate], accuracies: list[float]) -> Candidate:
    """The highest released accuracy; a tie goes to the later (longer-trained) checkpoint."""
    best = max(range(len(candidates)), key=lambda i: (accuracies[i], candidates[i].step))
    return candidates[best]


class CheckpointSelector:
    """Collects candidates as training goes and makes the one selection release at the end.

    `feedback` is an OwnerFeedback (upload_current, release_checkpoints).
    """

    def __init__(self, feedback: Any, every: int, max_candidates: int, total_steps: int):
        if every < 1:
            raise ValueError("CheckpointSelector: every must be >= 1")
        self.feedback = feedback
        self.every = every
        self.max_candidates = max_candidates
        self.total_steps = total_steps
        self.candidates: list[Candidate] = []

    def after_step(self, step: int) -> None:
        if step % self.every == 0 or step == self.total_steps:
            try:
                checkpoint_id = self.feedback.upload_current(f"select-step{step}")
            except FeedbackError as err:
                log.warning("could not upload the step-%d selection candidate (%s); it is skipped", step, err)
                return
            self.candidates.append(Candidate(step, checkpoint_id))

    def select(self) -> SelectionResult | None:
        """One release over the (thinned) candidates; None when the owner cannot answer."""
        if not self.candidates:
            return None
        candidates = thin(self.candidates, self.max_candidates)
        accuracies = self.feedback.release_checkpoints([c.checkpoint_id for c in candidates])
        if accuracies is None:
            log.warning("checkpoint selection skipped: the owner gave no release; the final model is reported")
            return None
        return SelectionResult(tuple(candidates), tuple(accuracies), choose(candidates, list(accuracies)))
