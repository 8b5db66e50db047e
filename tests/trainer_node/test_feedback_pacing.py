import pytest

from trainer_node.feedback.pacing import BudgetPacer


def test_pacer_spreads_budget_over_remaining_steps():
    pacer = BudgetPacer(total_steps=101, first_step=0)
    assert pacer.should_query(0)
    # each release costs 0.1 of 1.0 remaining -> 10 queries for 100 remaining steps
    assert pacer.record(0, epsilon_this_release=0.1, epsilon_remaining=1.0) == 10
    assert not pacer.should_query(9)
    assert pacer.should_query(10)


def test_pacer_stops_when_budget_cannot_pay_another_release():
    pacer = BudgetPacer(total_steps=50, reserve_queries=1)
    assert pacer.record(3, epsilon_this_release=0.5, epsilon_remaining=0.9) == 0
    assert pacer.exhausted and not pacer.should_query(100)


def test_pacer_without_dp_queries_at_min_interval():
    pacer = BudgetPacer(total_steps=10, min_interval=2, dp_enabled=False)
    assert pacer.record(0, 0.0, 0.0) == 2
    assert pacer.should_query(2)


def test_pacer_rejects_bad_settings():
    with pytest.raises(ValueError, match="total_steps"):
        BudgetPacer(total_steps=0)


def test_pacer_state_roundtrip():
    a = BudgetPacer(total_steps=20)
    a.record(0, 0.2, 1.0)
    b = BudgetPacer(total_steps=20)
    b.load_state_dict(a.state_dict())
    assert b.next_step == a.next_step
