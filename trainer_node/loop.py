"""The one run loop of our own GRPO trainer: `train`, the lab's simulate and its bench all run it.

It reads top to bottom, like nanochat's RL script:

    eval at start        (a resumed run was measured before it stopped)
    steps                train_step -> feedback hook (stats, selection candidates) -> log
                         (each step record carries its time per phase, grpo/timing.py)
                         every eval_every steps: eval; every save_every steps: checkpoint
    final eval + checkpoint
    feedback hook's end  (a final release, checkpoint selection)

and returns what the caller's summary needs (LoopResult); the caller writes summary.json.

What varies between callers comes in through two small hooks, so each piece can be reused
without this loop (the TRL/verl adapters run those engines' own loops and call the hooks
from their callbacks):
- an EvaluationHook measures the live model: `train` on its held-out source slice, the lab on
  the owner's test split through the owner process;
- a FeedbackHook runs around each step: trainer_node/feedback/hook.py's OwnerFeedbackHook
  (budget stats in the step record, checkpoint-selection candidates, the final release).
  The sampler's own update from target feedback happens inside train_step, through the
  FeedbackContext the policy gets (trainer_node/feedback/context.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainer_node.grpo.checkpoint import checkpoint_name, save_checkpoint
from trainer_node.grpo.timing import cpu_key, phase_key
from trainer_node.grpo.trainer import GRPOTrainer
from trainer_node.run_output import RunOutput


class EvaluationHook(Protocol):
    def evaluate(self, label: str) -> dict[str, Any] | None:
        """Measure the live model. `label` says when ("initial", "step20", "final").

        Returns the eval record to log ({"name": ..., "accuracy": ..., "accuracy/<domain>": ...};
        the loop adds step and rollouts_cumulative), or None when there is nothing to measure."""
        ...


@dataclass
class FeedbackOutcome:
    """What a feedback hook reports once training is over."""

    evals: list[dict[str, Any]] = field(default_factory=list)
    """Eval records to log (e.g. a final release of the target's accuracy)."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Keys for the run's summary (queries, failures, epsilon spent, ...)."""
    selection: Any = None
    """A trainer_node.feedback.selection.SelectionResult when checkpoints were selected, else None."""


class FeedbackHook(Protocol):
    def after_step(self, step: int, record: dict[str, Any]) -> None:
        """Called once `step` steps are done, before their record is logged: add statistics to
        `record`, take per-step actions (e.g. upload a selection candidate)."""
        ...

    def finish(self, step: int) -> FeedbackOutcome:
        """Called once after the final eval and checkpoint."""
        ...


class NoFeedback:
    """The feedback hook of a run without a target owner."""

    def after_step(self, step: int, record: dict[str, Any]) -> None:
        return None

    def finish(self, step: int) -> FeedbackOutcome:
        return FeedbackOutcome()


@dataclass(frozen=True)
class Schedule:
    steps: int
    """Total steps, counting those a resumed run already did."""
    eval_every: int = 0
    """Evaluate every k steps (0 = only at start and end)."""
    save_every: int = 0
    """Checkpoint every k steps (0 = only at the end)."""
    checkpoint_dir: Path | None = None
    """Where checkpoints/step_N go; None = no checkpoints at all (the lab's runs)."""

    def evaluates_after(self, done: int) -> bool:
        return done < self.steps and self.eval_every > 0 and done % self.eval_every == 0

    def saves_after(self, done: int) -> bool:
        return (self.checkpoint_dir is not None and done < self.steps and self.save_every > 0
                and done % self.save_every == 0)


@dataclass
class LoopResult:
    initial: dict[str, Any] | None
    """The eval record before training (None: resumed, or nothing to measure)."""
    final: dict[str, Any] | None
    final_checkpoint: Path | None
    feedback: FeedbackOutcome


def run_loop(
    trainer: GRPOTrainer,
    output: RunOutput,
    schedule: Schedule,
    evaluation: EvaluationHook,
    feedback: FeedbackHook | None = None,
) -> LoopResult:
    """Train until trainer.step_index reaches schedule.steps; see the module docstring."""
    feedback = feedback or NoFeedback()

    def measure(label: str) -> dict[str, Any] | None:
        record = evaluation.evaluate(label)
        if record is None:
            return None
        record = {"step": trainer.step_index, "rollouts_cumulative": trainer.rollouts_cumulative, **record}
        output.log_eval(record)
        return record

    def checkpoint(done: int) -> Path:
        return save_checkpoint(trainer, schedule.checkpoint_dir / checkpoint_name(done))

    # 1. eval at start
    initial = measure("initial") if trainer.step_index == 0 else None

    # 2. steps
    while trainer.step_index < schedule.steps:
        record = trainer.train_step()
        done = trainer.step_index
        hook_started, hook_cpu = time.perf_counter(), time.thread_time()
        feedback.after_step(done, record)
        hook_seconds = time.perf_counter() - hook_started  # the hook's work is part of the step's time
        record[phase_key("other")] = record.get(phase_key("other"), 0.0) + hook_seconds
        record[cpu_key("other")] = record.get(cpu_key("other"), 0.0) + time.thread_time() - hook_cpu
        record["step_seconds"] = record.get("step_seconds", 0.0) + hook_seconds
        output.log_step(record)
        if schedule.evaluates_after(done):
            measure(f"step{done}")
        if schedule.saves_after(done):
            checkpoint(done)

    # 3. final eval + checkpoint
    final = measure("final")
    final_checkpoint = checkpoint(trainer.step_index) if schedule.checkpoint_dir is not None else None

    # 4. what the feedback hook does at the end (a final release, checkpoint selection)
    outcome = feedback.finish(trainer.step_index)
    for record in outcome.evals:
        output.log_eval({"step": trainer.step_index, "rollouts_cumulative": trainer.rollouts_cumulative, **record})
    return LoopResult(initial, final, final_checkpoint, outcome)
