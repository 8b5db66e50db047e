"""OwnerFeedback against an in-memory owner: candidates as per-tensor shards (only changed
tensors travel), synchronous and asynchronous queries, and the asynchronous query's snapshot."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from tests.trainer_node.grpo_helpers import make_model_dir, make_settings, make_trainer
from trainer_node.feedback.client import FeedbackError
from trainer_node.feedback.context import FeedbackSettings, connect_owner_feedback

EMBEDDING = "model.embed_tokens.weight"


class MemoryOwner:
    """Stores uploaded files by sha256 (the owner's content addressing) and releases, for each
    checkpoint, the mean of its input embedding: a number that follows the weights exactly."""

    def __init__(self, fail_evaluate: bool = False):
        self.blobs: dict[str, bytes] = {}
        self.checkpoints: dict[str, dict[str, str]] = {}
        self.sent: list[list[str]] = []
        self.fail_evaluate = fail_evaluate
        self.last_upload_bytes = 0

    def info(self):
        return SimpleNamespace(privacy=SimpleNamespace(enabled=True))

    def upload(self, model_dir: Path, digests=None):
        files = {}
        sent = []
        for path in sorted(Path(model_dir).iterdir()):
            digest = (digests or {}).get(path.name) or hashlib.sha256(path.read_bytes()).hexdigest()
            assert digest == hashlib.sha256(path.read_bytes()).hexdigest(), "a given digest must be the file's"
            if digest not in self.blobs:
                self.blobs[digest] = path.read_bytes()
                sent.append(path.name)
            files[path.name] = digest
        self.sent.append(sent)
        self.last_upload_bytes = sum(len(self.blobs[files[n]]) for n in sent)
        checkpoint_id = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
        self.checkpoints[checkpoint_id] = files
        return checkpoint_id

    def embedding_mean(self, checkpoint_id: str) -> float:
        files = self.checkpoints[checkpoint_id]
        index = json.loads(self.blobs[files["model.safetensors.index.json"]])
        shard = index["weight_map"][EMBEDDING]
        from safetensors.torch import load

        return float(load(self.blobs[files[shard]])[EMBEDDING].mean())

    def evaluate(self, checkpoint_ids, decoding, split=pb.SPLIT_FEEDBACK):
        if self.fail_evaluate:
            raise FeedbackError("owner down")
        return pb.EvaluateResponse(
            results=[pb.CandidateResult(checkpoint_id=c, accuracy=self.embedding_mean(c)) for c in checkpoint_ids],
            privacy=pb.PrivacySpend(epsilon_this_release=0.1, epsilon_spent_total=0.1, epsilon_remaining=3.9),
        )

    def close(self):
        pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("context"))


def connect(owner, trainer, tmp_path):
    settings = FeedbackSettings(total_steps=20, max_new_tokens=4, seed=0)
    return connect_owner_feedback(owner, trainer, settings, tmp_path / "sent")


def test_a_candidate_that_changes_one_tensor_sends_one_shard(model_dir, tmp_path):
    trainer = make_trainer(model_dir)
    owner = MemoryOwner()
    feedback = connect(owner, trainer, tmp_path)
    base = trainer.current_state_dict()
    feedback.upload_state(base, "base")
    changed = dict(base, **{EMBEDDING: base[EMBEDDING] + 1.0})
    checkpoint = feedback.upload_state(changed, "one")
    shards = [n for n in owner.sent[1] if n.endswith(".safetensors")]
    assert owner.sent[1] == shards and len(shards) == 1, "only the changed tensor's shard travels"
    assert owner.embedding_mean(checkpoint) == pytest.approx(float(changed[EMBEDDING].mean()))
    first = sum(len(owner.blobs[d]) for d in set(owner.checkpoints[next(iter(owner.checkpoints))].values()))
    one_shard = len(owner.blobs[owner.checkpoints[checkpoint][shards[0]]])
    assert feedback.stats.uploaded_bytes == first + one_shard
    assert one_shard < 0.5 * first


def test_async_lookahead_equals_the_synchronous_query_of_the_same_moment(model_dir, tmp_path):
    trainer = make_trainer(model_dir, make_settings(adam_eps=1e-4))
    trainer.train_step()
    groups = trainer.sample_and_rollout(1).groups
    weights = [[1.0 if i % 2 == 0 else 0.0 for i in range(len(groups))], [1.0] * len(groups)]
    sync_owner, async_owner = MemoryOwner(), MemoryOwner()
    sync = connect(sync_owner, trainer, tmp_path / "a").evaluate(trainer.lookahead_state_dicts(groups, weights))
    feedback = connect(async_owner, trainer, tmp_path / "b")
    pending = feedback.submit_lookahead(groups, weights)
    trainer.train_step()  # training goes on while the query is in flight
    released = pending.result()
    assert released == pytest.approx(sync, abs=1e-7), "candidates are built from the snapshot, not the live model"
    assert pending.ready() and feedback.stats.queries == 1 and feedback.pacer.next_step >= 1
    assert feedback.stats.background_candidates_s > 0 and feedback.stats.background_owner_s >= 0
    # the background thread's CPU (what it can take from training on a shared CPU) is at least
    # its candidate building, which is compute; the summary carries the split
    assert feedback.stats.background_cpu_s > 0
    split = feedback.stats.background_summary()
    assert set(split) == {f"feedback_background/{k}" for k in ("candidates_s", "upload_s", "owner_s", "cpu_s")}


def test_a_query_without_the_base_releases_the_candidates_alone(model_dir, tmp_path):
    """with_base = False (L2RR's lookahead: its estimate is base-free): the live model is neither
    uploaded nor scored, synchronously or in the background, and the candidates' accuracies are
    what they are with the base."""
    trainer = make_trainer(model_dir, make_settings(adam_eps=1e-4))
    trainer.train_step()
    groups = trainer.sample_and_rollout(1).groups
    weights = [[1.0 if i % 2 == 0 else 0.0 for i in range(len(groups))], [1.0] * len(groups)]
    candidates = trainer.lookahead_state_dicts(groups, weights)
    full = connect(MemoryOwner(), trainer, tmp_path / "a").evaluate(candidates)
    owner = MemoryOwner()
    without = connect(owner, trainer, tmp_path / "b").evaluate(candidates, with_base=False)
    assert len(full) == 3 and without == pytest.approx(full[1:], abs=1e-7)
    assert len(owner.checkpoints) == 2, "the base was not uploaded"
    async_owner = MemoryOwner()
    feedback = connect(async_owner, trainer, tmp_path / "c")
    pending = feedback.submit_lookahead(groups, weights, with_base=False)
    released = pending.result()
    assert released == pytest.approx(without, abs=1e-7) and len(async_owner.checkpoints) == 2
    assert feedback.stats.candidates_evaluated == 2


def test_one_query_in_flight_and_a_failed_one_returns_none(model_dir, tmp_path):
    trainer = make_trainer(model_dir)
    groups = trainer.sample_and_rollout(0).groups
    feedback = connect(MemoryOwner(fail_evaluate=True), trainer, tmp_path)
    pending = feedback.submit_lookahead(groups, [[1.0] * len(groups)])
    assert not feedback.should_query(0)  # nothing new while one is in flight
    with pytest.raises(RuntimeError, match="already in flight"):
        feedback.submit_lookahead(groups, [[1.0] * len(groups)])
    assert pending.result() is None and feedback.stats.failures == 1
    assert feedback.should_query(0)
    feedback.close()


def test_the_run_end_books_a_query_still_in_flight(model_dir, tmp_path):
    from trainer_node.feedback.hook import OwnerFeedbackHook

    trainer = make_trainer(model_dir)
    groups = trainer.sample_and_rollout(0).groups
    feedback = connect(MemoryOwner(), trainer, tmp_path)
    feedback.submit_lookahead(groups, [[1.0] * len(groups)])
    outcome = OwnerFeedbackHook(feedback).finish(1)
    assert outcome.summary["feedback_queries"] == 1
    assert torch.is_tensor(trainer.current_state_dict()[EMBEDDING])


def test_a_run_without_background_queries_reports_no_background_split():
    from trainer_node.feedback.context import FeedbackStats

    assert FeedbackStats().background_summary() == {}


def test_a_tapped_async_lookahead_reuses_the_update_and_equals_the_synchronous_query(model_dir, tmp_path, monkeypatch):
    """The asynchronous query's candidates come from the gradients of the update that follows it
    (grpo/gradient_tap.py): the same release as recomputing them, and no backward pass of their own."""
    trainer = make_trainer(model_dir, make_settings(adam_eps=1e-4))
    trainer.train_step()
    groups = trainer.sample_and_rollout(1).groups
    weights = [[1.0 if i % 2 == 0 else 0.0 for i in range(len(groups))],
               [0.0 if i % 2 == 0 else 1.0 for i in range(len(groups))], [1.0] * len(groups)]
    sync = connect(MemoryOwner(), trainer, tmp_path / "a").evaluate(trainer.lookahead_state_dicts(groups, weights))

    def no_recompute(*args, **kwargs):
        raise AssertionError("a filled tap needs no recomputed candidates")

    monkeypatch.setattr(trainer, "_lookahead", no_recompute)
    feedback = connect(MemoryOwner(), trainer, tmp_path / "b")
    pending = feedback.submit_lookahead(groups, weights)
    trainer.update(groups)  # the step's own update, class by class: it fills the tap
    released = pending.result()
    assert released == pytest.approx(sync, abs=1e-6)
    assert released[3] != pytest.approx(released[0], abs=1e-9), "the all-ones candidate moved"


def test_a_tap_for_another_batch_is_declined_and_the_candidates_recomputed(model_dir, tmp_path):
    trainer = make_trainer(model_dir, make_settings(adam_eps=1e-4))
    groups = trainer.sample_and_rollout(0).groups
    weights = [[1.0] * len(groups)]
    sync = connect(MemoryOwner(), trainer, tmp_path / "a").evaluate(trainer.lookahead_state_dicts(groups, weights))
    feedback = connect(MemoryOwner(), trainer, tmp_path / "b")
    pending = feedback.submit_lookahead(groups, weights)
    trainer.update(list(reversed(groups)))  # not the query's batch (order differs): declined
    assert pending.result() == pytest.approx(sync, abs=1e-7)


def test_waiting_for_a_query_before_any_update_does_not_deadlock(model_dir, tmp_path):
    """The background thread waits for the next update's gradients; a training thread that waits
    for the release first declines the tap, so the candidates are recomputed instead."""
    trainer = make_trainer(model_dir)
    groups = trainer.sample_and_rollout(0).groups
    feedback = connect(MemoryOwner(), trainer, tmp_path)
    pending = feedback.submit_lookahead(groups, [[1.0] * len(groups)])
    assert pending.result() is not None and feedback.stats.queries == 1
    trainer.update(groups)  # the declined tap is gone: a plain update
    feedback.close()
