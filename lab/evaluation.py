"""Evaluation hooks on the target's TEST split: only a simulation may measure there.

Both implement trainer_node/loop.py's EvaluationHook. `OwnerTestEvaluation` is what
simulate reports: the owner process scores the uploaded live model on its test split (exact
and uncharged, so served only when the owner is set up for a simulation). `LocalTestEvaluation`
scores the same split in this process with the owner's scorer, for tools that run GRPO
without an owner (tools/bench_grpo_cpu.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from trainer_node.evaluation import flatten_accuracy, local_accuracy
from trainer_node.feedback.context import OwnerClient, OwnerFeedback
from trainer_node.training import TrainingSetup

if TYPE_CHECKING:
    from trainer_node.config import TrainConfig

TEST_SEED = 20261130  # one decoding seed for every test-split evaluation by the owner


def owner_test_decoding(config: TrainConfig) -> pb.DecodingSettings:
    """How the simulated owner decodes the TEST split for the before/after accuracy: greedy by
    default, or k samples at a temperature ([simulated_owner] test_samples_per_prompt, test_temperature)."""
    owner = config.simulated_owner
    return pb.DecodingSettings(max_new_tokens=config.rollout.max_new_tokens,
                               samples_per_prompt=owner.test_samples_per_prompt,
                               temperature=owner.test_temperature, seed=TEST_SEED)


def sampled_decoding_summary(config: TrainConfig) -> dict[str, Any]:
    """The summary.json key naming a sampled test decoding ({} when greedy, the default), so a
    reader of any simulation's summary knows whether its accuracy is greedy or avg@k."""
    owner = config.simulated_owner
    if owner.test_samples_per_prompt == 1 and owner.test_temperature == 0:
        return {}
    return {"target_test_decoding": {"samples_per_prompt": owner.test_samples_per_prompt,
                                     "temperature": owner.test_temperature}}


def sampled_decoding_words(summary: dict[str, Any]) -> str:
    """'avg@4 at temperature 1, ' for a summary with a sampled test decoding; '' when greedy."""
    decoding = summary.get("target_test_decoding")
    if not decoding:
        return ""
    return f"avg@{decoding['samples_per_prompt']} at temperature {decoding['temperature']:g}, "


@dataclass
class OwnerTestEvaluation:
    client: OwnerClient
    feedback: OwnerFeedback
    """Uploads the live model (its checkpoint travels as any candidate does)."""
    decoding: pb.DecodingSettings
    """owner_test_decoding(config)."""
    health_check: Callable[[], None] | None = None
    """Runs first: the lab's check that the owner process is alive."""

    def evaluate(self, label: str) -> dict[str, Any]:
        self._check()
        return self._measure(self.feedback.upload_current(label), "target_test")

    def evaluate_checkpoint(self, checkpoint_id: str, name: str) -> dict[str, Any]:
        """Test-split accuracy of an uploaded checkpoint (e.g. the selected one)."""
        self._check()
        return self._measure(checkpoint_id, name)

    def _check(self) -> None:
        if self.health_check is not None:
            self.health_check()

    def _measure(self, checkpoint_id: str, name: str) -> dict[str, Any]:
        result = self.client.evaluate([checkpoint_id], self.decoding, split=pb.SPLIT_TEST).results[0]
        return {"name": name, "accuracy": result.accuracy,
                **{f"accuracy/{d}": a for d, a in sorted(result.domain_accuracy.items())}}


@dataclass
class LocalTestEvaluation:
    setup: TrainingSetup
    seed: int = 0

    def evaluate(self, label: str) -> dict[str, Any]:
        result = local_accuracy(self.setup.engine, self.setup.data.test, self.setup.template,
                                self.setup.config.rollout.max_new_tokens, seed=self.seed)
        return {"name": "target_test", **flatten_accuracy(result)}


def domain_accuracy(record: dict[str, Any]) -> dict[str, float]:
    """{"accuracy/<domain>": a} keys of an eval record -> {domain: a}."""
    return {key.split("/", 1)[1]: value for key, value in record.items() if key.startswith("accuracy/")}
