"""One OwnerClient contract, two transports: the direct mTLS gRPC client and Flower messages
through the shim (flower_shim/) to the same owner node. Same answers, same errors."""

from __future__ import annotations

import pytest

from protocol import errors
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from trainer_node.feedback.client import BudgetExhausted, FeedbackError, OwnerUnavailable

DECODING = pb.DecodingSettings(max_new_tokens=4, samples_per_prompt=1, seed=3)


def test_info_and_budget_are_the_owners(transport, owner):
    info = transport.info()
    assert info.heldout_size > 0 and info.privacy.enabled
    budget = transport.budget()
    assert budget.dp_enabled and budget.epsilon_spent == 0.0


def test_upload_then_evaluate_releases_and_charges(transport, tiny_checkpoint):
    checkpoint_id = transport.upload(tiny_checkpoint)
    response = transport.evaluate([checkpoint_id], DECODING)
    assert [r.checkpoint_id for r in response.results] == [checkpoint_id]
    assert 0.0 <= response.results[0].accuracy <= 1.0
    assert response.privacy.epsilon_this_release > 0
    assert transport.budget().epsilon_spent == pytest.approx(response.privacy.epsilon_spent_total)


def test_an_unknown_checkpoint_is_the_same_error(transport):
    with pytest.raises(FeedbackError) as caught:
        transport.evaluate(["0" * 64], DECODING)
    assert caught.value.reason == errors.UNKNOWN_CHECKPOINT
    assert not isinstance(caught.value, BudgetExhausted)


def test_a_spent_budget_is_budget_exhausted(transport, tiny_checkpoint):
    checkpoint_id = transport.upload(tiny_checkpoint)
    with pytest.raises(BudgetExhausted) as caught:
        for _ in range(10):
            transport.evaluate([checkpoint_id], DECODING)
    assert caught.value.reason == errors.PRIVACY_BUDGET_EXHAUSTED


def test_an_owner_that_is_down_is_unavailable(owner, pki):
    from tests.federation.conftest import direct_client, flower_client

    port = owner.port
    owner.shutdown(grace_s=0, drain_delay_s=0)
    for client in (direct_client(port, pki), flower_client(port, pki)):
        with pytest.raises(OwnerUnavailable):
            client.budget()
        client.close()
