"""The trainer's difference releases (trainer_node/feedback/release.py): what OwnerFeedback asks,
the clip it measures on its own prompts (feedback/clip_calibration.py), what it does when there is
nothing to release, and L2RR reading the differences along the clusters' running directions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from tests.trainer_node.grpo_helpers import make_model_dir, make_settings, make_trainer
from tests.trainer_node.test_feedback_context import MemoryOwner
from trainer_node.feedback.context import FeedbackSettings, connect_owner_feedback
from trainer_node.feedback.release import ReleaseOptions
from trainer_node.policies.l2rr import L2rrOptions


class DifferenceOwner(MemoryOwner):
    """A MemoryOwner that serves difference releases: each candidate's embedding mean minus the base's."""

    def __init__(self, max_clip: float = 0.5):
        super().__init__()
        self.max_clip = max_clip
        self.requests: list[tuple[list[str], pb.DecodingSettings, pb.DifferenceRequest | None]] = []

    def info(self):
        return SimpleNamespace(privacy=SimpleNamespace(enabled=True),
                               difference_support=SimpleNamespace(max_clip=self.max_clip))

    def evaluate(self, checkpoint_ids, decoding, split=pb.SPLIT_FEEDBACK, difference=None):
        self.requests.append((list(checkpoint_ids), decoding, difference))
        if difference is None:
            return super().evaluate(checkpoint_ids, decoding, split)
        base = self.embedding_mean(checkpoint_ids[0])
        return pb.EvaluateResponse(
            kind=pb.RELEASE_KIND_ACCURACY_DIFFERENCE,
            results=[pb.CandidateResult(checkpoint_id=c, accuracy_difference=self.embedding_mean(c) - base)
                     for c in checkpoint_ids[1:]],
            privacy=pb.PrivacySpend(noise_std=0.001, epsilon_this_release=0.1, epsilon_spent_total=0.1,
                                    epsilon_remaining=3.9),
        )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("difference-queries"))


def connect(owner, trainer, tmp_path):
    return connect_owner_feedback(owner, trainer, FeedbackSettings(total_steps=20, max_new_tokens=4, seed=0),
                                  tmp_path / "sent")


def directions_trainer(model_dir):
    trainer = make_trainer(model_dir, make_settings(lookahead_directions="cluster_mean",
                                                    lookahead="adam_preconditioned"), batch_size=6)
    trainer.train_step()
    return trainer


def test_a_fixed_clip_asks_for_one_difference_per_candidate_with_the_base_first(model_dir, tmp_path):
    trainer = directions_trainer(model_dir)
    owner = DifferenceOwner()
    feedback = connect(owner, trainer, tmp_path)
    candidates = trainer.direction_state_dicts([{"even": 1.0}, {"odd": 1.0}])
    release = ReleaseOptions(kind="difference", clip=0.02)
    values = feedback.evaluate(candidates, with_base=False, release=release)  # the base goes anyway
    ids, decoding, difference = owner.requests[-1]
    assert len(ids) == 3 and len(values) == 2
    assert (difference.metric, difference.clip) == ("answer_probability", 0.02)
    assert decoding.samples_per_prompt == 1  # the answer metric scores the reference, not samples
    assert feedback.stats.last_clip == 0.02 and feedback.stats.log[-1]["kind"] == "difference"
    base = owner.embedding_mean(ids[0])
    assert values == pytest.approx([owner.embedding_mean(i) - base for i in ids[1:]])


def test_the_clip_is_a_quantile_of_the_trainers_own_differences_capped_at_the_owners(model_dir, tmp_path):
    trainer = directions_trainer(model_dir)
    owner = DifferenceOwner(max_clip=0.5)
    feedback = connect(owner, trainer, tmp_path)
    candidates = trainer.direction_state_dicts([{"even": 1.0}, {"odd": 1.0}])
    release = ReleaseOptions(kind="difference", clip_quantile=0.5, calibration_prompts=8)
    feedback.evaluate(candidates, release=release)
    clip = owner.requests[-1][2].clip
    calibration = feedback._calibration(release)
    measured = calibration.differences(trainer.current_state_dict(), candidates, _decoding(owner.requests[-1][1]))
    assert clip == pytest.approx(float(np.quantile(np.abs(measured), 0.5)))
    assert 0 < clip <= 0.5 and len(calibration.examples) == 8
    capped = connect(DifferenceOwner(max_clip=1e-15), trainer, tmp_path / "capped")
    capped.evaluate(candidates, release=release)
    assert capped.client.requests[-1][2].clip == 1e-15


def test_a_sampling_metric_asks_for_samples_at_its_temperature(model_dir, tmp_path):
    trainer = directions_trainer(model_dir)
    owner = DifferenceOwner()
    feedback = connect(owner, trainer, tmp_path)
    candidates = trainer.direction_state_dicts([{"even": 1.0}])
    feedback.evaluate(candidates, release=ReleaseOptions(kind="difference", metric="importance", clip=0.1,
                                                         temperature=0.8, samples_per_prompt=3))
    decoding = owner.requests[-1][1]
    assert (decoding.temperature, decoding.samples_per_prompt) == (pytest.approx(0.8), 3)


def test_candidates_equal_to_the_base_are_not_sent(model_dir, tmp_path):
    trainer = directions_trainer(model_dir)
    owner = DifferenceOwner()
    feedback = connect(owner, trainer, tmp_path)
    same = [trainer.current_state_dict()]
    assert feedback.evaluate(same, release=ReleaseOptions(kind="difference")) is None
    assert owner.requests == [] and owner.sent == [] and feedback.stats.skipped == 1
    assert feedback.stats.failures == 0


def test_async_direction_queries_release_differences(model_dir, tmp_path):
    trainer = directions_trainer(model_dir)
    owner = DifferenceOwner()
    feedback = connect(owner, trainer, tmp_path)
    pending = feedback.submit_directions([{"even": 1.0}, {"odd": 1.0}], with_base=False,
                                         release=ReleaseOptions(kind="difference", calibration_prompts=8))
    trainer.train_step()
    values = pending.result()
    assert len(values) == 2 and len(owner.requests[-1][0]) == 3
    assert owner.requests[-1][2].clip > 0 and feedback.stats.queries == 1


def test_l2rr_plans_one_candidate_per_cluster_with_a_direction_and_reads_differences(model_dir, tmp_path):
    """L2RR's lookahead along running directions: every cluster seen so far gets a candidate (not only
    those of the step's batch), and a difference release is read as [0, *differences]."""
    from trainer_node.policies.l2rr import L2rrPolicy

    trainer = directions_trainer(model_dir)
    owner = DifferenceOwner()
    feedback = connect(owner, trainer, tmp_path)
    options = L2rrOptions(batch_size=4, rollouts_per_prompt=4, max_staleness=0,
                          release=ReleaseOptions(kind="difference", clip=0.05))
    policy = L2rrPolicy(trainer.pool, options, np.random.default_rng(0))
    batch = [g for g in trainer.sample_and_rollout(1).groups if g.cluster == "even"]  # one cluster in the batch
    policy.before_update(1, batch, feedback)
    ids, _, difference = owner.requests[-1]
    assert len(ids) == 3 and difference.clip == 0.05  # base + a candidate for each of the 2 clusters
    assert policy.feedback_queries == 1
    released = {name: policy.last_hypergrad[c] for c, name in enumerate(policy.cluster_names)}
    base = owner.embedding_mean(ids[0])
    assert sorted(released.values()) == pytest.approx(sorted(owner.embedding_mean(i) - base for i in ids[1:]))


def _decoding(decoding: pb.DecodingSettings):
    from rlvr_core.scoring import Decoding

    return Decoding(decoding.max_new_tokens, decoding.samples_per_prompt or 1, decoding.temperature, decoding.seed)
