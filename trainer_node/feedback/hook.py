"""OwnerFeedbackHook: what a run does around its steps when a target owner answers it.

The run loop (trainer_node/loop.py) calls it after every step and once at the end; an
engine adapter with its own loop (TRL, verl) can call the same two methods from its callbacks.

- after each step: the budget statistics go into the step's record, and, when checkpoint
  selection is on, the live model becomes a candidate every `selector.every` steps;
- at the end: the optional final release of the live model's held-out accuracy (charged like
  any release), then the one checkpoint-selection release.

When the budget runs out (the owner refuses a release, or the pacer finds no query left in the
remaining budget) feedback stops and training goes on; the summary says at which step and why
(`feedback_stopped_step`, `feedback_stopped_reason`).

The policy's own use of the owner (L2RR's lookahead releases) is not here: it happens inside
the training step, through the OwnerFeedback context the policy holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer_node.feedback.context import OwnerFeedback
from trainer_node.feedback.selection import CheckpointSelector
from trainer_node.loop import FeedbackOutcome


class OwnerFeedbackHook:
    def __init__(
        self,
        feedback: OwnerFeedback,
        *,
        selector: CheckpointSelector | None = None,
        final_release: bool = False,
        health_check: Callable[[], None] | None = None,
    ):
        """`health_check` runs after every step (the lab's: the owner process is still alive)."""
        self.feedback = feedback
        self.selector = selector
        self.final_release = final_release
        self.health_check = health_check
        self.stopped_step: int | None = None
        self.stopped_reason = ""

    def _note_stop(self, step: int) -> None:
        pacer = getattr(self.feedback, "pacer", None)
        if self.stopped_step is None and pacer is not None and pacer.exhausted:
            self.stopped_step = step
            self.stopped_reason = getattr(self.feedback, "stop_reason", "") or (
                "the privacy budget left holds no further query (budget pacing)")

    def after_step(self, step: int, record: dict[str, Any]) -> None:
        if self.health_check is not None:
            self.health_check()
        self._note_stop(step)
        stats = self.feedback.stats
        record.update(feedback_queries=stats.queries, feedback_failures=stats.failures,
                      epsilon_spent=stats.epsilon_spent, feedback_uploaded_bytes=stats.uploaded_bytes,
                      feedback_query_uploaded_bytes=stats.query_uploaded_bytes,
                      feedback_noise_std=stats.last_noise_std, feedback_clip=stats.last_clip)
        if self.selector is not None:
            self.selector.after_step(step)

    def finish(self, step: int) -> FeedbackOutcome:
        outcome = FeedbackOutcome()
        drain = getattr(self.feedback, "drain", None)
        if drain is not None:
            drain()  # an asynchronous query still in flight is booked before the end's releases
        if self.final_release:
            accuracy = self.feedback.release_current(step)
            if accuracy is not None:
                outcome.evals.append({"name": "target_feedback", "accuracy": accuracy})
                outcome.summary["target_feedback_accuracy"] = accuracy
        if self.selector is not None:
            outcome.selection = self.selector.select()
        stats = self.feedback.stats
        outcome.summary.update(feedback_queries=stats.queries, feedback_failures=stats.failures,
                               epsilon_spent=stats.epsilon_spent, feedback_query_uploaded_bytes=stats.query_uploaded_bytes)
        outcome.summary.update(stats.background_summary())  # asynchronous queries: the background thread's split
        self._note_stop(step)
        if self.stopped_step is not None:
            outcome.summary.update(feedback_stopped_step=self.stopped_step, feedback_stopped_reason=self.stopped_reason)
        return outcome
