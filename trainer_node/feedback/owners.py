"""Feedback from several target owners behind the one FeedbackContext a policy already uses.

`MultiOwnerFeedback` composes one OwnerFeedback per owner: each with its own OwnerClient (any
transport: direct gRPC or Flower), its own BudgetPacer and its own budget. A query asks every
live owner whose pacer is due and whose weight is not zero for one release of the same
candidates; the released accuracies are combined by a registered aggregation
(`AGGREGATIONS`), renormalized over the owners that answered this time:

- `heldout_size`: weights proportional to each owner's public held-out size (GetInfo);
- `mixture`: the target mixture the trainer declares (`mixture = {owner = weight}`);
- `per_owner`: one named owner's releases only (`owner = "name"`): L2RR learns q against that
  owner's target, and the others are asked only for the final release.

Checkpoint selection (trainer_node/feedback/selection.py) works the same way: a candidate is
uploaded to every live owner that has weight, the one selection release asks each of them for one
multi-candidate release of its own copies, and the released accuracies combine with the same
weights, renormalized over the owners that answered; the chosen candidate is the best aggregate.

An owner that is out of budget, or that failed `drop_after_failures` queries in a row, is dropped
with a log line; training goes on with the others, and `summary()` names every lost owner with the
step it was lost at and why. Privacy needs nothing here: each owner's node spends and enforces its
own budget; the numbers an owner releases are already noised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer_node.feedback.aggregation import AGGREGATIONS, AggregationOptions
from trainer_node.feedback.context import FeedbackStats, OwnerFeedback

log = logging.getLogger("trainer_node.feedback")

@dataclass
class Owner:
    name: str
    feedback: OwnerFeedback
    heldout_size: int
    weight: float = 0.0
    lost_step: int | None = None
    lost_reason: str = ""
    failures_in_a_row: int = 0
    last_accuracy: float | None = None

    @property
    def live(self) -> bool:
        return self.lost_step is None


@dataclass
class AllOwnersPacer:
    """What OwnerFeedbackHook reads of a pacer: exhausted once no owner with weight is left."""

    owners: list[Owner]

    @property
    def exhausted(self) -> bool:
        return not any(o.live and o.weight > 0 and not o.feedback.pacer.exhausted for o in self.owners)


@dataclass
class MultiOwnerFeedback:
    """Implements trainer_node.policies.base.FeedbackContext against several owners."""

    owners: list[Owner]
    trainer: Any
    options: AggregationOptions
    stats: FeedbackStats = field(default_factory=FeedbackStats)
    stop_reason: str = ""
    left_out: dict[str, str] = field(default_factory=dict)
    """Owners configured but left out before the first step (name -> why: failed the start checks)."""

    _selection_ids: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    """Checkpoint selection: the key upload_current returned -> each owner's own checkpoint id."""

    def __post_init__(self) -> None:
        names = [o.name for o in self.owners]
        if len(set(names) | set(self.left_out)) != len(names) + len(self.left_out) or not names:
            raise ValueError(f"owners: names must be unique and at least one owner given, got {names}")
        weights = AGGREGATIONS.get(self.options.name)({o.name: o.heldout_size for o in self.owners}, self.options)
        for owner in self.owners:
            owner.weight = weights[owner.name]
        self.pacer = AllOwnersPacer(self.owners)
        self._step = 0

    @property
    def client(self) -> Any:  # what run_training closes at the end
        return self

    def close(self) -> None:
        for owner in self.owners:
            owner.feedback.client.close()

    # --- FeedbackContext ----------------------------------------------------------------

    def _due(self, step: int) -> list[Owner]:
        return [o for o in self.owners if o.live and o.weight > 0 and o.feedback.pacer.should_query(step)]

    def should_query(self, step: int) -> bool:
        self._step = step
        return bool(self._due(step))

    def candidates(self, batch: Sequence[Any], weights: Sequence[Sequence[float]]) -> list[Any]:
        return self.trainer.lookahead_state_dicts(batch, weights)

    def direction_clusters(self) -> list[str]:
        return list(self.trainer.direction_clusters()) if hasattr(self.trainer, "direction_clusters") else []

    def direction_candidates(self, mixtures: Sequence[Any]) -> list[Any]:
        return self.trainer.direction_state_dicts(mixtures)

    def evaluate(self, candidates: Sequence[Any], release: Any = None) -> list[float] | None:
        """One release per due owner (a difference release: each owner's clip from the trainer's prompts),
        aggregated with the owners' weights."""
        extra = {} if release is None else {"release": release}
        return self._release(self._due(self._step), lambda o: o.feedback.evaluate(candidates, **extra))

    def release_current(self, step: int) -> float | None:
        """The final release: every live owner (weight or not) is asked once; the aggregate is returned."""
        self._step = step
        released = self._release([o for o in self.owners if o.live], lambda o: o.feedback.release_current(step),
                                 final=True)
        return released[0] if released else None

    # --- checkpoint selection (CheckpointSelector's two calls) -------------------------------

    def _selecting(self) -> list[Owner]:
        return [o for o in self.owners if o.live and o.weight > 0]

    def upload_current(self, label: str = "current") -> str:
        """The live model, uploaded to every live owner with weight; returns this run's key for it
        (each owner's checkpoint id is its own). A candidate an owner could not take is not one:
        FeedbackError, and the selector skips it, as with one owner."""
        from trainer_node.feedback.client import FeedbackError

        ids: dict[str, str] = {}
        for owner in self._selecting():
            try:
                ids[owner.name] = owner.feedback.upload_current(label)
            except FeedbackError as error:
                raise FeedbackError(f"owner {owner.name!r} did not take the candidate {label!r}: {error}",
                                    error.code, error.reason) from None
        if not ids:
            raise FeedbackError(f"no live owner with weight to upload the candidate {label!r} to")
        key = f"{label}#{len(self._selection_ids)}"
        self._selection_ids[key] = ids
        return key

    def release_checkpoints(self, keys: Sequence[str]) -> list[float] | None:
        """The selection release: each live owner with weight that holds every candidate releases their
        accuracies once (charged by that owner); the aggregate per candidate, or None if none answered."""
        owners = [o for o in self._selecting() if all(o.name in self._selection_ids[key] for key in keys)]

        def ask(owner: Owner) -> list[float] | None:
            ids = [self._selection_ids[key][owner.name] for key in keys]
            unique = list(dict.fromkeys(ids))  # an unchanged model is one checkpoint at the owner: in it once
            released = owner.feedback.release_checkpoints(unique)
            if released is None:
                return None
            by_id = dict(zip(unique, released, strict=True))
            return [by_id[checkpoint] for checkpoint in ids]

        return self._release(owners, ask)

    def _release(self, owners: list[Owner], ask: Callable[[Owner], Any], final: bool = False) -> list[float] | None:
        answers: dict[str, list[float]] = {}
        for owner in owners:
            owner.feedback._step = self._step
            value = ask(owner)
            if value is None:
                self._note_failure(owner)
                continue
            owner.failures_in_a_row = 0
            answers[owner.name] = [value] if isinstance(value, float) else list(value)
            owner.last_accuracy = answers[owner.name][0]
        weighted = {name: values for name, values in answers.items()
                    if final or next(o for o in self.owners if o.name == name).weight > 0}
        self._update_stats(answers)
        if not weighted:
            return None
        weights = {o.name: (o.weight if o.weight > 0 else (1.0 if final and self._no_weight_left() else 0.0))
                   for o in self.owners if o.name in weighted}
        total = sum(weights.values())
        if total <= 0:
            return None
        width = min(len(v) for v in weighted.values())
        return [sum(weights[name] * weighted[name][i] for name in weighted) / total for i in range(width)]

    def _no_weight_left(self) -> bool:
        return not any(o.live and o.weight > 0 for o in self.owners)

    def _note_failure(self, owner: Owner) -> None:
        owner.failures_in_a_row += 1
        self.stats.failures += 1
        if owner.feedback.pacer.exhausted:
            reason = owner.feedback.stop_reason or "its privacy budget left holds no further query"
        elif owner.failures_in_a_row >= self.options.drop_after_failures:
            reason = f"unreachable for {owner.failures_in_a_row} queries in a row"
        else:
            return
        owner.lost_step, owner.lost_reason = self._step, reason
        left = [o.name for o in self.owners if o.live]
        log.warning("target owner %r lost at step %d (%s); training goes on with %s", owner.name, self._step,
                    reason, ", ".join(left) or "no owner")
        if not any(o.live and o.weight > 0 for o in self.owners):
            self.stop_reason = f"every owner the policy learns from is lost (last: {owner.name!r}, {reason})"

    def _update_stats(self, answers: dict[str, list[float]]) -> None:
        if answers:
            self.stats.queries += 1
        self.stats.candidates_evaluated = sum(o.feedback.stats.candidates_evaluated for o in self.owners)
        # Each owner's held-out set is its own: the privacy loss of any one owner is its own spend,
        # so the run's figure is the largest per-owner spend (every owner's is in summary()).
        self.stats.epsilon_spent = max(o.feedback.stats.epsilon_spent for o in self.owners)
        self.stats.epsilon_remaining = min(o.feedback.stats.epsilon_remaining for o in self.owners)

    def summary(self) -> dict[str, Any]:
        return {
            "aggregation": self.options.name,
            "owners": {o.name: {"weight": round(o.weight, 6), "heldout_size": o.heldout_size,
                                "queries": o.feedback.stats.queries, "failures": o.feedback.stats.failures,
                                "epsilon_spent": o.feedback.stats.epsilon_spent,
                                "last_accuracy": o.last_accuracy,
                                "lost_step": o.lost_step, "lost_reason": o.lost_reason or None}
                       for o in self.owners}
            | {name: {"weight": 0.0, "queries": 0, "lost_step": 0, "lost_reason": reason}
               for name, reason in self.left_out.items()},
            "owners_lost": [{"owner": name, "step": 0, "reason": reason} for name, reason in self.left_out.items()]
            + [{"owner": o.name, "step": o.lost_step, "reason": o.lost_reason} for o in self.owners if not o.live],
        }


def connect_owners(clients: dict[str, Any], trainer: Any, settings: Any, workdir: Any,
                   options: AggregationOptions, left_out: dict[str, str] | None = None) -> MultiOwnerFeedback:
    """One OwnerFeedback (own pacer) per named client, through the one wiring connect_owner_feedback;
    `left_out` names the configured owners that failed the start checks (summary: lost at step 0)."""
    from pathlib import Path

    from trainer_node.feedback.client import FeedbackError
    from trainer_node.feedback.context import connect_owner_feedback

    owners = []
    for name, client in clients.items():
        feedback = connect_owner_feedback(client, trainer, settings, Path(workdir) / name)
        try:
            size = int(client.info().heldout_size)
        except FeedbackError:
            size = 0
        owners.append(Owner(name, feedback, size))
    return MultiOwnerFeedback(owners, trainer, options, left_out=dict(left_out or {}))


__all__ = ["AGGREGATIONS", "AggregationOptions", "MultiOwnerFeedback", "Owner", "connect_owners"]
