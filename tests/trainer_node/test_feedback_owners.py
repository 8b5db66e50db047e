"""Several owners behind one FeedbackContext: aggregation by name, one pacer per owner, a lost
owner dropped with the step and reason in the summary, training going on with the others."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from trainer_node.feedback.aggregation import AGGREGATIONS, AggregationOptions
from trainer_node.feedback.context import FeedbackStats
from trainer_node.feedback.owners import MultiOwnerFeedback, Owner
from trainer_node.feedback.pacing import BudgetPacer


class FakeOwnerFeedback:
    """OwnerFeedback's surface: releases `accuracy` per candidate; `down` fails, `spent` refuses."""

    def __init__(self, accuracy: float, dp: bool = False):
        self.accuracy = accuracy
        self.pacer = BudgetPacer(total_steps=10, dp_enabled=dp)
        self.stats = FeedbackStats()
        self.stop_reason = ""
        self.down = self.spent = False
        self.asked = 0
        self._step = 0
        self.client = self

    def evaluate(self, candidates):
        self.asked += 1
        if self.spent:
            self.pacer.mark_exhausted()
            self.stop_reason = "the owner refused a release: PRIVACY_BUDGET_EXHAUSTED"
            return None
        if self.down:
            self.stats.failures += 1
            return None
        self.stats.queries += 1
        self.stats.epsilon_spent += 0.5
        self.pacer.record(self._step, 0.0, 0.0)
        return [self.accuracy] * (len(candidates) + 1)

    def release_current(self, step):
        released = self.evaluate([])
        return released[0] if released else None

    def close(self):
        pass


def owners(**accuracies):
    sizes = {"a": 100, "b": 300, "c": 600}
    return [Owner(name, FakeOwnerFeedback(acc), sizes[name]) for name, acc in accuracies.items()]


def test_the_three_aggregations_are_registered():
    assert {"heldout_size", "mixture", "per_owner"} <= set(AGGREGATIONS.names())
    with pytest.raises(ValidationError, match="aggregation 'median' is unknown"):
        AggregationOptions(name="median")


def test_heldout_size_weights_the_releases():
    feedback = MultiOwnerFeedback(owners(a=0.0, b=1.0), trainer=None, options=AggregationOptions())
    assert feedback.should_query(0)
    assert feedback.evaluate(["x"]) == [pytest.approx(0.75)] * 2


def test_a_declared_mixture_weights_the_releases_and_names_a_bad_field():
    options = AggregationOptions(name="mixture", mixture={"a": 3.0, "b": 1.0})
    assert MultiOwnerFeedback(owners(a=0.0, b=1.0), None, options).evaluate([]) == [pytest.approx(0.25)]
    with pytest.raises(ValueError, match="owners.mixture.*missing: b"):
        MultiOwnerFeedback(owners(a=0.0, b=1.0), None, AggregationOptions(name="mixture", mixture={"a": 1.0}))


def test_per_owner_learns_from_one_owner_and_never_spends_the_others_during_training():
    group = owners(a=0.2, b=0.9)
    feedback = MultiOwnerFeedback(group, None, AggregationOptions(name="per_owner", owner="b"))
    assert feedback.evaluate([]) == [0.9]
    assert group[0].feedback.asked == 0
    assert feedback.release_current(5) == pytest.approx(0.9)  # the final release: b's, a asked too
    assert group[0].feedback.asked == 1
    with pytest.raises(ValueError, match="owners.owner: 'z'"):
        MultiOwnerFeedback(owners(a=0.2), None, AggregationOptions(name="per_owner", owner="z"))


def test_each_owner_has_its_own_pacer():
    group = owners(a=0.0, b=1.0)
    feedback = MultiOwnerFeedback(group, None, AggregationOptions())
    group[1].feedback.pacer.next_step = 5  # b is not due before step 5
    assert feedback.should_query(0)
    assert feedback.evaluate([]) == [0.0]  # only a answered: renormalized over a
    assert group[1].feedback.asked == 0


def test_a_lost_owner_is_dropped_and_named_with_its_step(caplog):
    group = owners(a=0.2, b=0.4, c=0.8)
    feedback = MultiOwnerFeedback(group, None, AggregationOptions(drop_after_failures=2))
    group[2].feedback.down = True
    group[0].feedback.spent = True
    with caplog.at_level(logging.WARNING, logger="trainer_node.feedback"):
        for step in range(4):
            feedback.should_query(step)
            assert feedback.evaluate([]) == [pytest.approx(0.4)]
    summary = feedback.summary()
    lost = {entry["owner"]: entry for entry in summary["owners_lost"]}
    assert lost["a"]["step"] == 0 and "PRIVACY_BUDGET_EXHAUSTED" in lost["a"]["reason"]
    assert lost["c"]["step"] == 1 and "unreachable for 2 queries" in lost["c"]["reason"]
    assert summary["owners"]["b"]["lost_step"] is None
    assert group[2].feedback.asked == 2, "a dropped owner is not asked again"
    assert "target owner 'c' lost at step 1" in caplog.text
    assert not feedback.pacer.exhausted
    group[1].feedback.down = True
    for step in (4, 5):
        feedback.should_query(step)
        assert feedback.evaluate([]) is None
    assert feedback.pacer.exhausted and "every owner" in feedback.stop_reason
