"""Checkpoint selection with several owners (issue 44): each candidate goes to every live owner with
weight, the one selection release asks each of them once, and the candidate chosen is the best of
the releases combined with the run's aggregation weights (renormalized over the owners that answered)."""

from __future__ import annotations

import pytest

from tests.trainer_node.test_feedback_owners import FakeOwnerFeedback
from trainer_node.feedback.aggregation import AggregationOptions
from trainer_node.feedback.client import FeedbackError, OwnerUnavailable
from trainer_node.feedback.owners import MultiOwnerFeedback, Owner
from trainer_node.feedback.selection import CheckpointSelector


class SelectingOwner(FakeOwnerFeedback):
    """Releases `by_step[step]` for the candidate uploaded at that step; `refuse_upload` fails uploads."""

    def __init__(self, by_step: dict[int, float]):
        super().__init__(0.0)
        self.by_step = by_step
        self.refuse_upload = False
        self.releases: list[list[str]] = []

    def upload_current(self, label):
        if self.refuse_upload:
            raise OwnerUnavailable(f"{label}: unreachable")
        return f"id-{label}"

    def release_checkpoints(self, ids):
        self.releases.append(list(ids))
        if self.down:
            self.stats.failures += 1
            return None
        self.stats.queries += 1
        return [self.by_step[int(checkpoint.removeprefix("id-select-step"))] for checkpoint in ids]


def run_selection(group, options=None, between=None):
    feedback = MultiOwnerFeedback(group, trainer=None, options=options or AggregationOptions())
    selector = CheckpointSelector(feedback, every=1, max_candidates=4, total_steps=3)
    for step in (1, 2, 3):
        if between is not None:
            between(step)
        selector.after_step(step)
    return feedback, selector.select()


def test_the_candidate_chosen_is_the_best_weighted_release_and_each_owner_is_asked_once():
    a = SelectingOwner({1: 0.9, 2: 0.1, 3: 0.2})
    b = SelectingOwner({1: 0.1, 2: 0.5, 3: 0.3})
    _, result = run_selection([Owner("a", a, 100), Owner("b", b, 300)])  # heldout_size: weights 1/4, 3/4
    assert result.released_accuracy == pytest.approx((0.3, 0.4, 0.275))
    assert result.chosen.step == 2
    assert a.releases == b.releases == [["id-select-step1", "id-select-step2", "id-select-step3"]]


def test_an_owner_without_weight_is_not_asked_and_a_down_owner_is_left_out_of_the_aggregate():
    a, b, c = (SelectingOwner({1: x, 2: y, 3: 0.0}) for x, y in ((0.9, 0.1), (0.1, 0.5), (0.0, 1.0)))
    b.down = True
    options = AggregationOptions(name="mixture", mixture={"a": 1.0, "b": 1.0, "c": 0.0})
    feedback, result = run_selection([Owner("a", a, 100), Owner("b", b, 100), Owner("c", c, 100)], options)
    assert result.released_accuracy == pytest.approx((0.9, 0.1, 0.0)) and result.chosen.step == 1  # a's alone
    assert c.releases == [] and b.stats.failures == 1 and feedback.stats.failures == 1


def test_a_candidate_an_owner_could_not_take_is_skipped():
    a = SelectingOwner({1: 0.9, 2: 0.1, 3: 0.2})
    b = SelectingOwner({1: 0.1, 2: 0.5, 3: 0.3})

    def refuse_at_step_2(step):
        b.refuse_upload = step == 2

    _, result = run_selection([Owner("a", a, 100), Owner("b", b, 300)], between=refuse_at_step_2)
    assert [c.step for c in result.candidates] == [1, 3] and result.chosen.step == 1
    gone = Owner("a", SelectingOwner({}), 100, lost_step=1, lost_reason="unreachable")
    with pytest.raises(FeedbackError, match="no live owner with weight"):
        MultiOwnerFeedback([gone], None, AggregationOptions()).upload_current("x")


def test_candidates_that_are_one_checkpoint_at_an_owner_are_released_once():
    """A model that did not change between two candidates is one checkpoint (content addressed)."""

    class Frozen(SelectingOwner):
        def upload_current(self, label):
            return "id-select-step1"

    a = Frozen({1: 0.4})
    _, result = run_selection([Owner("a", a, 100)])
    assert a.releases == [["id-select-step1"]] and result.released_accuracy == (0.4, 0.4, 0.4)
    assert result.chosen.step == 3  # a tie goes to the longer-trained checkpoint
