"""Difference releases (RELEASE_KIND_ACCURACY_DIFFERENCE) on the owner: the clip and the noise
calibrated to it, the charge (the event of an accuracy release of as many values), the ledger's
record and its replay, the exact mode, and every refusal before a charge.

A FakeScorer gives every row of candidate c the same difference from the base, unclipped, so a
release's randomness is only the subsample and the noise (SeededRandom)."""

from __future__ import annotations

import base64
import json
import shutil

import grpc
import numpy as np
import pytest

from protocol import errors
from protocol.errors import ProtocolError, reason_of
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.privacy.mechanisms import SeededRandom
from target_owner_node.evaluate_request import DIFFERENCE, FEEDBACK, Decoding, EvaluateInputs, ReleaseSpec
from target_owner_node.ledger import LEDGER_FILE
from target_owner_node.node import open_node
from target_owner_node.server import info_response

from .conftest import (
    HELDOUT_SIZE,
    FakeScorer,
    RecordingClient,
    make_config,
    read_jsonl,
    running_server,
    upload_messages,
)

DECODING = Decoding(max_new_tokens=4, samples_per_prompt=1, temperature=0.0, seed=1)


def difference(ids, clip=0.1, metric="answer_probability", request_id="") -> EvaluateInputs:
    return EvaluateInputs(tuple(ids), DECODING, FEEDBACK, request_id, ReleaseSpec(DIFFERENCE, metric, clip))


def accuracy(ids, request_id="") -> EvaluateInputs:
    return EvaluateInputs(tuple(ids), DECODING, FEEDBACK, request_id)


@pytest.fixture()
def node_factory(tmp_path, data_dir, pki):
    opened = []

    def open_(privacy=None, scorer=None, seed=0, **sections):
        config = make_config(tmp_path, data_dir, pki, privacy=privacy or {}, **sections)
        node = open_node(config, scorer=scorer or FakeScorer(), random_source=SeededRandom(seed))
        opened.append(node)
        return node

    yield open_
    for node in opened:
        node.close()


def _checkpoints(node, tiny_checkpoint, tmp_path, count: int) -> list[str]:
    ids = [node.store.receive(upload_messages(tiny_checkpoint)).checkpoint_id]
    for index in range(1, count):
        other = tmp_path / f"other{index}"
        shutil.copytree(tiny_checkpoint, other)
        (other / "generation_config.json").write_text(json.dumps({"do_sample": False, "n": index}))
        ids.append(node.store.receive(upload_messages(other)).checkpoint_id)
    return ids


def test_noise_is_calibrated_to_the_clip(node_factory, tiny_checkpoint, tmp_path):
    """q = 1: released = the clipped difference + N(0, (z c / N)^2): noise c times an accuracy release's."""
    planned, clip = 150, 0.05
    node = node_factory(privacy={"sample_rate": 1.0, "planned_releases": planned, "epsilon_budget": 2.0})
    base, candidate = _checkpoints(node, tiny_checkpoint, tmp_path, 2)
    node.scorer.differences_of[candidate] = 0.02
    results = [node.releases.evaluate("trainer", difference([base, candidate], clip)) for _ in range(planned)]
    expected_std = node.noise_multiplier * clip / HELDOUT_SIZE
    assert all(r.noise_std == pytest.approx(expected_std) for r in results)
    assert results[0].noise_std == pytest.approx(node.releases.noise_std * clip)
    errors_ = np.array([r.values[0] for r in results]) - 0.02
    assert abs(errors_.mean()) < 4 * expected_std / np.sqrt(planned)
    ratio = errors_.var(ddof=1) / expected_std**2
    assert 0.55 < ratio < 1.5, ratio
    with pytest.raises(ProtocolError) as caught:  # the same number of releases fits as for accuracy
        node.releases.evaluate("trainer", difference([base, candidate], clip))
    assert caught.value.reason == errors.PRIVACY_BUDGET_EXHAUSTED


def test_a_row_outside_the_clip_counts_as_the_clip(node_factory, tiny_checkpoint, tmp_path):
    node = node_factory(privacy={"sample_rate": 1.0, "planned_releases": 10, "epsilon_budget": 1.0})
    base, up, down = _checkpoints(node, tiny_checkpoint, tmp_path, 3)
    node.scorer.differences_of.update({up: 5.0, down: -5.0})
    result = node.releases.evaluate("trainer", difference([base, up, down], clip=0.1))
    pending = next(e for e in read_jsonl(node.config.storage.dir / LEDGER_FILE) if e["type"] == "pending")
    noise = np.asarray(pending["noise_draws"])
    assert result.values == pytest.approx(tuple((np.array([0.1, -0.1]) * HELDOUT_SIZE + noise) / HELDOUT_SIZE))
    assert result.valued_ids == (up, down)


def test_a_difference_release_is_charged_as_an_accuracy_release_of_its_candidates(node_factory, tiny_checkpoint,
                                                                                   tmp_path):
    """The base has no released value: base + 2 candidates costs what 2 accuracy values cost."""
    node = node_factory(privacy={"sample_rate": 1.0, "planned_releases": 20, "epsilon_budget": 4.0})
    base, first, second = _checkpoints(node, tiny_checkpoint, tmp_path, 3)
    spent = node.releases.evaluate("trainer", difference([base, first, second])).epsilon_this_release
    other = node_factory(privacy={"sample_rate": 1.0, "planned_releases": 20, "epsilon_budget": 4.0},
                         storage={"dir": str(tmp_path / "storage2")})
    (tmp_path / "second").mkdir()
    a, b = _checkpoints(other, tiny_checkpoint, tmp_path / "second", 2)
    assert other.releases.evaluate("trainer", accuracy([a, b])).epsilon_this_release == pytest.approx(spent)


def test_the_ledger_records_the_kind_and_a_retry_replays_it(node_factory, tiny_checkpoint, tmp_path):
    privacy = {"sample_rate": 0.5, "planned_releases": 20, "epsilon_budget": 4.0}
    node = node_factory(privacy=privacy)
    base, candidate = _checkpoints(node, tiny_checkpoint, tmp_path, 2)
    first = node.releases.evaluate("trainer", difference([base, candidate], 0.2, request_id="r1"))
    pending = next(e for e in read_jsonl(node.config.storage.dir / LEDGER_FILE) if e["type"] == "pending")
    assert pending["release"] == {"kind": "difference", "metric": "answer_probability", "clip": 0.2}
    assert pending["noise_std_sum"] == pytest.approx(node.noise_multiplier * 0.2)
    assert len(pending["noise_draws"]) == 1  # one released value: the candidate's
    mask = np.unpackbits(np.frombuffer(base64.b64decode(pending["mask_b64"]), np.uint8))[:HELDOUT_SIZE].astype(bool)
    expected = (0.02 * mask.sum() + pending["noise_draws"][0]) / (0.5 * HELDOUT_SIZE)
    assert first.values[0] == pytest.approx(np.clip(expected, -1, 1))
    node.close()
    reopened = node_factory(privacy=privacy, seed=99)  # a restart: the replay comes from the ledger
    again = reopened.releases.evaluate("trainer", difference([base, candidate], 0.2, request_id="r1"))
    assert again.values == first.values and again.release == first.release
    with pytest.raises(ProtocolError) as caught:  # the same id for another clip is another request
        reopened.releases.evaluate("trainer", difference([base, candidate], 0.3, request_id="r1"))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_a_charged_difference_release_that_failed_is_resumed_with_its_stored_noise(node_factory, tiny_checkpoint,
                                                                                    tmp_path):
    node = node_factory(privacy={"sample_rate": 1.0, "planned_releases": 10, "epsilon_budget": 1.0})
    base, candidate = _checkpoints(node, tiny_checkpoint, tmp_path, 2)
    node.scorer.fail_next = RuntimeError("worker crashed")
    with pytest.raises(ProtocolError) as caught:
        node.releases.evaluate("trainer", difference([base, candidate], request_id="r"))
    assert caught.value.reason == errors.EVALUATION_FAILED
    spent = node.budget.spent()
    result = node.releases.evaluate("trainer", difference([base, candidate], request_id="r"))
    assert node.budget.spent() == spent  # the retry is free
    pending = [e for e in read_jsonl(node.config.storage.dir / LEDGER_FILE) if e["type"] == "pending"]
    assert len(pending) == 1
    assert result.values[0] == pytest.approx((0.02 * HELDOUT_SIZE + pending[0]["noise_draws"][0]) / HELDOUT_SIZE)


def test_without_dp_the_release_is_the_exact_mean_of_the_clipped_differences(node_factory, tiny_checkpoint, tmp_path):
    node = node_factory(privacy={"enabled": False})
    base, small, large = _checkpoints(node, tiny_checkpoint, tmp_path, 3)
    node.scorer.differences_of.update({small: 0.01, large: -0.7})
    result = node.releases.evaluate("trainer", difference([base, small, large], clip=0.25))
    assert result.values == pytest.approx((0.01, -0.25)) and result.noise_std == 0.0
    assert node.scorer.difference_calls[-1][2] == HELDOUT_SIZE  # every row


def test_the_scorer_sees_the_public_row_count_and_the_request(node_factory, tiny_checkpoint, tmp_path):
    node = node_factory(privacy={"sample_rate": 0.3, "planned_releases": 50, "epsilon_budget": 8.0})
    base, candidate = _checkpoints(node, tiny_checkpoint, tmp_path, 2)
    for _ in range(3):
        node.releases.evaluate("trainer", difference([base, candidate], clip=0.05, metric="log_ratio"))
    assert {call[2] for call in node.scorer.difference_calls} == {node.releases.rows_per_query}
    assert {call[3:] for call in node.scorer.difference_calls} == {("log_ratio", 0.05)}
    assert node.scorer.calls == []  # nothing scored as accuracy


# -- over gRPC: what GetInfo declares, the response, and the refusals -------------------------------------------

@pytest.fixture()
def served(tmp_path, data_dir, pki):
    def start(**evaluation):
        config = make_config(tmp_path, data_dir, pki, privacy={"planned_releases": 5, "epsilon_budget": 1.0},
                             evaluation={"max_new_tokens": 8, "max_samples_per_prompt": 4,
                                         "max_candidates_per_query": 4, **evaluation})
        return running_server(config, scorer=FakeScorer(), random_source=SeededRandom(0))

    return start


def test_getinfo_declares_the_kind_its_metrics_and_clip(served, pki):
    with served(max_difference_clip=0.5) as running:
        info = info_response(running.node)
    assert list(info.release_kinds) == [pb.RELEASE_KIND_ACCURACY, pb.RELEASE_KIND_ACCURACY_DIFFERENCE]
    assert list(info.difference_support.metrics) == ["answer_probability", "importance", "log_ratio"]
    assert info.difference_support.max_clip == 0.5
    assert info.difference_support.answer_template == " {answer}"
    with served(difference_metrics=[]) as running:
        info = info_response(running.node)
    assert list(info.release_kinds) == [pb.RELEASE_KIND_ACCURACY] and not info.HasField("difference_support")


def test_the_response_carries_one_difference_per_candidate(served, pki, tiny_checkpoint, tmp_path):
    with served() as running:
        client = RecordingClient(running.port, pki)
        try:
            base = client.upload_dir(tiny_checkpoint).checkpoint_id
            other = tmp_path / "cand"
            shutil.copytree(tiny_checkpoint, other)
            (other / "generation_config.json").write_text('{"do_sample": false}')
            candidate = client.upload_dir(other).checkpoint_id
            response = client.evaluate_difference([base, candidate], clip=0.1)
            plain = client.evaluate([base, candidate])  # a v1 request without a kind: accuracy, as before
        finally:
            client.close()
    assert response.kind == pb.RELEASE_KIND_ACCURACY_DIFFERENCE
    assert [r.checkpoint_id for r in response.results] == [candidate]
    assert response.results[0].accuracy == 0.0 and response.results[0].accuracy_difference != 0.0
    assert response.privacy.noise_std == pytest.approx(info_noise(running) * 0.1)
    assert plain.kind == pb.RELEASE_KIND_ACCURACY and len(plain.results) == 2


def info_noise(running) -> float:
    return info_response(running.node).privacy.noise_std


REFUSALS = [
    ({"difference_metrics": []}, {}, errors.RELEASE_KIND_NOT_SERVED, "kind"),
    ({}, {"metric": "mine"}, errors.RELEASE_KIND_NOT_SERVED, "difference.metric"),
    ({"difference_metrics": ["importance"]}, {"metric": "answer_probability"}, errors.RELEASE_KIND_NOT_SERVED,
     "difference.metric"),
    ({}, {"clip": 0.0}, errors.DECODING_OUT_OF_LIMITS, "difference.clip"),
    ({}, {"clip": -0.1}, errors.DECODING_OUT_OF_LIMITS, "difference.clip"),
    ({}, {"clip": float("nan")}, errors.DECODING_OUT_OF_LIMITS, "difference.clip"),
    ({"max_difference_clip": 0.5}, {"clip": 0.6}, errors.DECODING_OUT_OF_LIMITS, "difference.clip"),
    ({}, {"metric": "importance"}, errors.DECODING_OUT_OF_LIMITS, "decoding.temperature"),
    ({}, {"samples_per_prompt": 2}, errors.DECODING_OUT_OF_LIMITS, "decoding.samples_per_prompt"),
    ({}, {"only_base": True}, errors.INVALID_REQUEST, "checkpoint_ids"),
    ({}, {"split": pb.SPLIT_TEST}, errors.INVALID_REQUEST, "kind"),
    ({}, {"no_settings": True}, errors.INVALID_REQUEST, "difference"),
    ({}, {"accuracy_with_settings": True}, errors.INVALID_REQUEST, "difference"),
    ({}, {"unknown_kind": True}, errors.INVALID_REQUEST, "kind"),
]


@pytest.mark.parametrize(("evaluation", "change", "reason", "field"), REFUSALS)
def test_a_bad_difference_request_is_refused_before_any_charge(served, pki, tiny_checkpoint, tmp_path, evaluation,
                                                                change, reason, field):
    with served(**evaluation) as running:
        client = RecordingClient(running.port, pki)
        try:
            base = client.upload_dir(tiny_checkpoint).checkpoint_id
            other = tmp_path / "cand"
            shutil.copytree(tiny_checkpoint, other)
            (other / "generation_config.json").write_text('{"do_sample": false}')
            candidate = client.upload_dir(other).checkpoint_id
            ledger = running.node.config.storage.dir / LEDGER_FILE
            before = ledger.read_bytes() if ledger.exists() else b""
            settings = pb.DifferenceRequest(metric=change.get("metric", "answer_probability"),
                                            clip=change.get("clip", 0.1))
            kind = pb.RELEASE_KIND_ACCURACY_DIFFERENCE
            if change.get("accuracy_with_settings"):
                kind = pb.RELEASE_KIND_ACCURACY
            if change.get("unknown_kind"):
                kind = 7
            with pytest.raises(grpc.RpcError) as caught:
                client.evaluate([base] if change.get("only_base") else [base, candidate], kind=kind,
                                difference=None if change.get("no_settings") else settings,
                                split=change.get("split", pb.SPLIT_FEEDBACK),
                                samples_per_prompt=change.get("samples_per_prompt", 1))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert reason_of(caught.value) == reason
            assert field in caught.value.details()
            assert client.budget().epsilon_spent == 0.0
            assert (ledger.read_bytes() if ledger.exists() else b"") == before
        finally:
            client.close()


def test_no_canary_leaves_through_a_difference_release(served, pki, tiny_checkpoint, tmp_path):
    """Held-out text in an exception while scoring differences becomes the one fixed error; nothing of
    it reaches the client, the logs or the audit log."""
    import io

    from target_owner_node import logs

    from .conftest import assert_no_canary, canary

    stream = io.StringIO()
    logs.configure(stream=stream)
    try:
        with served() as running:
            client = RecordingClient(running.port, pki)
            try:
                base = client.upload_dir(tiny_checkpoint).checkpoint_id
                other = tmp_path / "cand"
                shutil.copytree(tiny_checkpoint, other)
                (other / "generation_config.json").write_text('{"do_sample": false}')
                candidate = client.upload_dir(other).checkpoint_id
                client.evaluate_difference([base, candidate], request_id="d1")
                client.evaluate_difference([base, candidate], request_id="d1")  # replay
                running.node.scorer.fail_next = RuntimeError(f"scoring {canary('P', 1)} against {canary('A', 1)}")
                with pytest.raises(grpc.RpcError) as caught:
                    client.evaluate_difference([base, candidate])
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
                assert reason_of(caught.value) == errors.EVALUATION_FAILED
                audit = (running.node.config.storage.dir / "audit.jsonl").read_text()
            finally:
                client.close()
    finally:
        logs.configure(enabled=False)
    assert_no_canary(client.received)
    assert "CANARY" not in stream.getvalue() and "CANARY" not in audit
    assert '"kind":"difference"' in audit
