"""Checkpoint selection by target feedback: candidate thinning, the choice rule, failure paths."""

import pytest

from trainer_node.feedback.client import FeedbackError
from trainer_node.feedback.selection import Candidate, CheckpointSelector, choose, thin


class FakeFeedback:
    def __init__(self, released=None, fail_upload_at=()):
        self.released = released
        self.fail_upload_at = set(fail_upload_at)
        self.uploads: list[str] = []
        self.queries: list[list[str]] = []

    def upload_current(self, label):
        step = int(label.removeprefix("select-step"))
        if step in self.fail_upload_at:
            raise FeedbackError("owner unreachable")
        self.uploads.append(label)
        return f"id-{step}"

    def release_checkpoints(self, ids):
        self.queries.append(list(ids))
        return None if self.released is None else self.released(ids)


def test_thin_keeps_the_last_and_spreads_evenly():
    cands = [Candidate(s, f"id{s}") for s in range(10, 110, 10)]  # 10 candidates
    kept = thin(cands, 4)
    assert [c.step for c in kept] == [10, 40, 70, 100]
    assert thin(cands[:3], 4) == cands[:3]


def test_choose_takes_the_best_and_breaks_ties_toward_later_steps():
    cands = [Candidate(10, "a"), Candidate(20, "b"), Candidate(30, "c")]
    assert choose(cands, [0.2, 0.5, 0.1]).step == 20
    assert choose(cands, [0.5, 0.5, 0.1]).step == 20


def test_selector_collects_every_k_steps_and_the_final_one_then_makes_one_release():
    fb = FakeFeedback(released=lambda ids: [{"id-4": 0.3, "id-8": 0.6, "id-10": 0.4}[i] for i in ids])
    selector = CheckpointSelector(fb, every=4, max_candidates=8, total_steps=10)
    for step in range(1, 11):
        selector.after_step(step)
    assert fb.uploads == ["select-step4", "select-step8", "select-step10"]
    result = selector.select()
    assert len(fb.queries) == 1 and fb.queries[0] == ["id-4", "id-8", "id-10"]  # ONE release, all candidates
    assert result.chosen.step == 8
    assert result.to_json() == {"candidate_steps": [4, 8, 10], "released_accuracy": [0.3, 0.6, 0.4], "selected_step": 8}


def test_selector_skips_failed_uploads_and_returns_none_without_a_release():
    fb = FakeFeedback(released=None, fail_upload_at={4})
    selector = CheckpointSelector(fb, every=4, max_candidates=8, total_steps=8)
    for step in range(1, 9):
        selector.after_step(step)
    assert fb.uploads == ["select-step8"]
    assert selector.select() is None  # budget exhausted / owner down: the final model is reported


def test_selector_rejects_a_zero_interval():
    with pytest.raises(ValueError, match="every"):
        CheckpointSelector(FakeFeedback(), every=0, max_candidates=8, total_steps=5)
