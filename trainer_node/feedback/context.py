"""OwnerFeedback: the FeedbackContext a data policy uses to learn from a remote target owner.

It turns lookahead parameter sets into checkpoint directories, uploads them (only changed
files travel), asks for ONE multi-candidate release on the owner's secret subsample, and
paces queries so the privacy budget lasts the run. When the owner is unreachable or the
budget is spent it returns None: training goes on with the policy's last state, and the
log says so. `connect_owner_feedback` is the one place an OwnerFeedback is built.
"""

from __future__ import annotations

import copy
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from rlvr_core.models.loading import save_policy
from trainer_node.feedback.client import BudgetExhausted, FeedbackError
from trainer_node.feedback.pacing import BudgetPacer

log = logging.getLogger("trainer_node.feedback")


class OwnerClient(Protocol):
    """What the feedback pieces ask of a transport to the owner. TargetFeedbackClient (gRPC +
    mTLS) is one; another transport (e.g. Flower) plugs in under the same five calls, raising
    trainer_node.feedback.client's FeedbackError / BudgetExhausted as that client does."""

    def info(self) -> pb.GetInfoResponse: ...

    def budget(self) -> pb.GetBudgetResponse: ...

    def upload(self, model_dir: Path) -> str: ...

    def evaluate(self, checkpoint_ids: list[str], decoding: pb.DecodingSettings,
                 split: int = pb.SPLIT_FEEDBACK) -> pb.EvaluateResponse: ...

    def close(self) -> None: ...


@dataclass
class FeedbackStats:
    queries: int = 0
    failures: int = 0
    candidates_evaluated: int = 0
    epsilon_spent: float = 0.0
    epsilon_remaining: float = 0.0
    last_noise_std: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)


class OwnerFeedback:
    """Implements trainer_node.policies.base.FeedbackContext against a live owner."""

    def __init__(
        self,
        client: OwnerClient,
        trainer: Any,  # GRPOTrainer: .model, .tokenizer, .lookahead_state_dicts(), .current_state_dict()
        pacer: BudgetPacer,
        decoding: pb.DecodingSettings,
        workdir: Path,
    ):
        self.client = client
        self.trainer = trainer
        self.pacer = pacer
        self.decoding = decoding
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stats = FeedbackStats()
        self.stop_reason = ""  # why queries stopped for good (OwnerFeedbackHook reports it)
        self._scratch = None
        self._step = 0

    # --- FeedbackContext ----------------------------------------------------------------

    def should_query(self, step: int) -> bool:
        self._step = step
        return self.pacer.should_query(step)

    def candidates(self, batch: Sequence[Any], weights: Sequence[Sequence[float]]) -> list[Any]:
        return self.trainer.lookahead_state_dicts(batch, weights)

    def release_current(self, step: int) -> float | None:
        """One release of the live model's held-out accuracy (noisy when DP is on), or None."""
        self._step = step
        accuracies = self.evaluate([])
        return accuracies[0] if accuracies else None

    def evaluate(self, candidates: Sequence[Any]) -> list[float] | None:
        """One release comparing the live model (first) with candidate parameter sets."""
        try:
            ids = [self.upload_state(self.trainer.current_state_dict(), "base")]
            ids += [self.upload_state(state, f"cand{i}") for i, state in enumerate(candidates)]
        except FeedbackError as err:
            self.stats.failures += 1
            log.warning("target owner unreachable; training goes on with the last sampler state (%s)", err)
            return None
        return self.release_checkpoints(ids)

    def release_checkpoints(self, checkpoint_ids: Sequence[str]) -> list[float] | None:
        """One (DP) release of the feedback-split accuracy of uploaded checkpoints, or None."""
        ids = list(checkpoint_ids)
        try:
            decoding = pb.DecodingSettings()
            decoding.CopyFrom(self.decoding)
            decoding.seed = self.decoding.seed + self._step  # fresh seed per query, shared by candidates
            response = self.client.evaluate(ids, decoding, split=pb.SPLIT_FEEDBACK)
        except BudgetExhausted as err:
            self.pacer.mark_exhausted()
            self.stop_reason = f"the owner refused a release: {err.reason or 'RESOURCE_EXHAUSTED'}"
            self.stats.failures += 1
            log.warning("target owner budget exhausted; keeping the last sampler state (%s)", err.reason)
            return None
        except FeedbackError as err:
            self.stats.failures += 1
            log.warning("target owner unreachable; training goes on with the last sampler state (%s)", err)
            return None
        privacy = response.privacy
        self.pacer.record(self._step, privacy.epsilon_this_release, privacy.epsilon_remaining)
        self.stats.queries += 1
        self.stats.candidates_evaluated += len(ids)
        self.stats.epsilon_spent = privacy.epsilon_spent_total
        self.stats.epsilon_remaining = privacy.epsilon_remaining
        self.stats.last_noise_std = privacy.noise_std
        accuracies = [result.accuracy for result in response.results]
        self.stats.log.append(
            {
                "step": self._step,
                "candidates": len(ids),
                "accuracies": accuracies,
                "epsilon_this_release": privacy.epsilon_this_release,
                "epsilon_spent": privacy.epsilon_spent_total,
            }
        )
        return accuracies

    # --- checkpoints --------------------------------------------------------------------

    def upload_state(self, state_dict: dict[str, Any], label: str) -> str:
        """Write parameters as an allowlisted checkpoint dir and upload it; returns its id."""
        if self._scratch is None:
            self._scratch = copy.deepcopy(self.trainer.model)
        self._scratch.load_state_dict(state_dict)
        out = self.workdir / label
        if out.exists():
            shutil.rmtree(out)
        save_policy(self._scratch, self.trainer.tokenizer, out)
        return self.client.upload(out)

    def upload_current(self, label: str = "current") -> str:
        return self.upload_state(self.trainer.current_state_dict(), label)


# --- wiring -------------------------------------------------------------------------------

@dataclass(frozen=True)
class FeedbackSettings:
    """How a run queries its owner: decoding of the owner's evaluations and budget pacing."""

    total_steps: int
    max_new_tokens: int
    seed: int
    """Decoding seed of the first query; each query adds its step (OwnerFeedback.release_checkpoints)."""
    samples_per_prompt: int = 1
    temperature: float = 0.0
    """0 = greedy, the lowest-variance estimate of the owner's accuracy."""
    min_interval: int = 1
    """Never query more often than every this many steps."""
    reserve_queries: int = 0
    """Releases the pacer keeps back from the sampler (1 for checkpoint selection)."""


def connect_owner_feedback(
    client: OwnerClient, trainer: Any, settings: FeedbackSettings, workdir: Path
) -> OwnerFeedback:
    """The one wiring of OwnerFeedback, its BudgetPacer and its decoding, for any client.

    `train` (a remote owner) and the lab (a local owner process) both build theirs here. An
    owner that does not answer at start is not fatal: the pacer assumes DP is on (the
    conservative choice) and the queries retry later.
    """
    try:
        dp_enabled = client.info().privacy.enabled
    except FeedbackError as error:
        log.warning("target owner not reachable at start (%s); training goes on and retries later", error)
        dp_enabled = True
    pacer = BudgetPacer(total_steps=settings.total_steps, min_interval=settings.min_interval,
                        dp_enabled=dp_enabled, reserve_queries=settings.reserve_queries)
    decoding = pb.DecodingSettings(max_new_tokens=settings.max_new_tokens,
                                   samples_per_prompt=settings.samples_per_prompt,
                                   temperature=settings.temperature, seed=settings.seed)
    return OwnerFeedback(client, trainer, pacer, decoding, workdir)

