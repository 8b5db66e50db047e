"""The node over real gRPC on loopback with mTLS (certificates made at test time).

Evaluation uses a FakeScorer here (fast); tests/target_owner_node/test_worker_evaluation.py
runs the real worker process with a tiny model.
"""

from __future__ import annotations

import io
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protocol import errors
from protocol.errors import error_info, reason_of
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.privacy.mechanisms import SeededRandom
from protocol.validation import MAX_CHUNK_BYTES
from target_owner_node import logs
from target_owner_node.node import NodeStartupError, open_node
from target_owner_node.server import start_server

from .conftest import (
    HELDOUT_SIZE,
    SERVICE,
    TEST_SIZE,
    FakeScorer,
    RecordingClient,
    assert_no_canary,
    canary,
    make_config,
    manifest_of,
    running_server,
    upload_messages,
)


@pytest.fixture()
def server(tmp_path, data_dir, pki):
    config = make_config(tmp_path, data_dir, pki, privacy={"planned_releases": 3, "epsilon_budget": 1.0})
    with running_server(config, scorer=FakeScorer(), random_source=SeededRandom(0)) as running:
        yield running


@pytest.fixture()
def client(server, pki):
    client = RecordingClient(server.port, pki)
    yield client
    client.close()


def _code_and_reason(call):
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), reason_of(caught.value)


# -- authentication ---------------------------------------------------------------------------
def test_client_without_certificate_is_refused(server, pki):
    credentials = grpc.ssl_channel_credentials(root_certificates=pki["ca_cert"].read_bytes())
    with grpc.secure_channel(f"localhost:{server.port}", credentials) as channel:
        stub = channel.unary_unary(
            "/target_feedback.v1.TargetFeedbackService/GetInfo",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.GetInfoResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            stub(pb.GetInfoRequest(), timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_certificate_from_another_ca_is_refused(server, pki):
    client = RecordingClient(server.port, pki, cert="other_client_cert", key="other_client_key")
    try:
        code, _ = _code_and_reason(lambda: client.info())
        assert code == grpc.StatusCode.UNAVAILABLE
    finally:
        client.close()


def test_plaintext_client_is_refused(server):
    with grpc.insecure_channel(f"localhost:{server.port}") as channel:
        stub = channel.unary_unary(
            "/target_feedback.v1.TargetFeedbackService/GetInfo",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.GetInfoResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            stub(pb.GetInfoRequest(), timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_allowlist_denies_other_client_names(tmp_path, data_dir, pki):
    config = make_config(tmp_path, data_dir, pki, access={"allowed_clients": ["someone-else"]})
    with running_server(config, scorer=FakeScorer()) as running:
        client = RecordingClient(running.port, pki)
        try:
            for call in (client.info, client.budget, lambda: client.evaluate(["0" * 64])):
                assert _code_and_reason(call) == (
                    grpc.StatusCode.PERMISSION_DENIED,
                    errors.CLIENT_NOT_ALLOWED,
                )
        finally:
            client.close()


# -- public information -----------------------------------------------------------------------
def test_info_and_budget(server, client):
    info = client.info()
    z = server.node.noise_multiplier
    assert info.heldout_size == HELDOUT_SIZE and info.test_split_enabled and info.test_size == TEST_SIZE
    assert info.privacy.enabled and info.privacy.noise_multiplier == pytest.approx(z) and z > 0
    q = server.node.config.privacy.sample_rate
    assert info.privacy.sample_rate == q and info.privacy.delta == 1e-5 and info.privacy.accountant == "rdp"
    assert info.privacy.expected_sample_size == pytest.approx(q * HELDOUT_SIZE)
    assert info.privacy.noise_std == pytest.approx(z / (q * HELDOUT_SIZE))
    assert info.decoding_limits.max_candidates_per_query == 4
    assert info.upload_limits.max_chunk_bytes == MAX_CHUNK_BYTES and info.prompt_template == "{prompt}"
    budget = client.budget()
    assert budget.dp_enabled and budget.epsilon_spent == 0 and budget.epsilon_budget == 1.0
    assert budget.releases_remaining_estimate == 3


# -- the privacy invariant: no canary in any byte the client receives -------------------------
def test_no_canary_reaches_the_client_on_any_rpc(server, client, tiny_checkpoint, tmp_path):
    log_stream = io.StringIO()
    logs.configure(stream=log_stream)
    try:
        client.info()
        client.budget()
        checkpoint_id = client.upload_dir(tiny_checkpoint).checkpoint_id
        client.upload_dir(tiny_checkpoint)  # reuse path
        bad_uploads = [
            list(upload_messages(tiny_checkpoint))[1:],  # no manifest first
            [
                pb.UploadCheckpointRequest(
                    manifest=pb.CheckpointManifest(
                        files=[pb.FileEntry(name="pytorch_model.bin", size=1, sha256="0" * 64)]
                    )
                )
            ],
        ]
        for messages in bad_uploads:
            with pytest.raises(grpc.RpcError):
                client.upload_messages(messages)
        client.evaluate([checkpoint_id], request_id="a")
        client.evaluate([checkpoint_id], request_id="a")  # replay
        client.evaluate([checkpoint_id], split=pb.SPLIT_TEST)
        failing = [
            lambda: client.evaluate(["f" * 64]),  # unknown checkpoint
            lambda: client.evaluate(["../../etc/passwd"]),
            lambda: client.evaluate([checkpoint_id], max_new_tokens=10_000),  # decoding out of limits
            lambda: client.evaluate([checkpoint_id], samples_per_prompt=99),
            lambda: client.evaluate([checkpoint_id], temperature=float("nan")),
            lambda: client.evaluate([checkpoint_id], request_id="a", seed=2),  # id reused differently
        ]
        # an unexpected exception whose text quotes held-out data must become a generic INTERNAL
        server.node.scorer.fail_next = RuntimeError(
            f"boom while scoring {canary('P', 3)} -> {canary('A', 3)}"
        )
        failing.append(lambda: client.evaluate([checkpoint_id]))
        for _ in range(3):
            failing.append(lambda: client.evaluate([checkpoint_id]))  # exhausts the budget
        codes = []
        for call in failing:
            try:
                call()
                codes.append("OK")
            except grpc.RpcError as error:
                codes.append(reason_of(error))
        assert codes[:6] == [
            errors.UNKNOWN_CHECKPOINT,
            errors.UNKNOWN_CHECKPOINT,
            errors.DECODING_OUT_OF_LIMITS,
            errors.DECODING_OUT_OF_LIMITS,
            errors.DECODING_OUT_OF_LIMITS,
            errors.INVALID_REQUEST,
        ]
        assert codes[6] == errors.EVALUATION_FAILED
        assert errors.PRIVACY_BUDGET_EXHAUSTED in codes[7:]
        client.budget()
    finally:
        logs.configure(enabled=False)
    assert len(client.received) > 15
    assert_no_canary(client.received)
    assert "CANARY" not in log_stream.getvalue(), "held-out data reached the logs"
    assert "CANARY" not in (server.node.config.storage.dir / "audit.jsonl").read_text()


def test_unexpected_error_is_generic_internal(server, client, tiny_checkpoint, monkeypatch):
    monkeypatch.setattr(server.node.store, "context_length", lambda cid: 1 / 0)
    checkpoint_id = client.upload_dir(tiny_checkpoint).checkpoint_id
    with pytest.raises(grpc.RpcError) as caught:
        client.evaluate([checkpoint_id])
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == "internal error on the target owner's node"


def test_a_failed_evaluation_is_the_one_fixed_error_without_data(server, client, tiny_checkpoint):
    checkpoint_id = client.upload_dir(tiny_checkpoint).checkpoint_id
    server.node.scorer.fail_next = ValueError(canary("A", 7))
    with pytest.raises(grpc.RpcError) as caught:
        client.evaluate([checkpoint_id])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_info(caught.value).reason == errors.EVALUATION_FAILED
    assert "CANARY" not in caught.value.details()


def test_requests_that_could_never_be_evaluated_are_refused_before_any_charge(server, client, tiny_checkpoint):
    """Charge-then-fail: a seed the engines refuse, or more new tokens than the model's context
    leaves room for, is INVALID_ARGUMENT and the ledger is unchanged."""
    checkpoint_id = client.upload_dir(tiny_checkpoint).checkpoint_id
    ledger = server.node.config.storage.dir / "privacy_ledger.jsonl"
    before = ledger.read_bytes() if ledger.exists() else b""
    spent = client.budget().epsilon_spent
    for decoding in ({"seed": 2**63}, {"seed": 2**64 - 1}):
        with pytest.raises(grpc.RpcError) as caught:
            client.evaluate([checkpoint_id], **decoding)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "decoding.seed" in caught.value.details()
    server.node.store.context_length = lambda cid: 4  # a model with 4 positions: no room after 4 tokens
    with pytest.raises(grpc.RpcError) as caught:
        client.evaluate([checkpoint_id], max_new_tokens=4)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_new_tokens" in caught.value.details()
    assert client.budget().epsilon_spent == spent
    assert (ledger.read_bytes() if ledger.exists() else b"") == before


def test_unparseable_requests_are_invalid_argument_with_a_reason(server, client):
    for method in ("GetInfo", "Evaluate", "GetBudget"):
        stub = client.channel.unary_unary(SERVICE + method, request_serializer=lambda raw: raw,
                                          response_deserializer=lambda raw: raw)
        with pytest.raises(grpc.RpcError) as caught:
            stub(b"\xff\xff\xff\xff", timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert error_info(caught.value).reason == errors.INVALID_REQUEST
    upload = client.channel.stream_unary(SERVICE + "UploadCheckpoint", request_serializer=lambda raw: raw,
                                         response_deserializer=lambda raw: raw)
    with pytest.raises(grpc.RpcError) as caught:
        upload(iter([b"\x0a\xff\xff"]), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == errors.INVALID_REQUEST


# -- budget over the wire ---------------------------------------------------------------------
def test_budget_exhaustion_is_resource_exhausted_with_metadata(server, client, tiny_checkpoint):
    checkpoint_id = client.upload_dir(tiny_checkpoint).checkpoint_id
    for i in range(3):
        response = client.evaluate([checkpoint_id], request_id=f"r{i}")
        assert response.privacy.epsilon_this_release > 0 and len(response.results) == 1
    assert response.privacy.epsilon_spent_total <= 1.0 + 1e-9
    with pytest.raises(grpc.RpcError) as caught:
        client.evaluate([checkpoint_id], request_id="r3")
    info = error_info(caught.value)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.reason == errors.PRIVACY_BUDGET_EXHAUSTED and info.domain == errors.ERROR_DOMAIN
    assert float(info.metadata["limit"]) == 1.0 and float(info.metadata["spent"]) == pytest.approx(
        response.privacy.epsilon_spent_total
    )
    assert "budget" in caught.value.details()
    budget = client.budget()
    assert budget.releases_made == 3 and budget.releases_remaining_estimate == 0
    assert budget.client_epsilon_spent == pytest.approx(budget.epsilon_spent)
    # an earlier request is still replayable after exhaustion (it costs nothing)
    assert client.evaluate([checkpoint_id], request_id="r0").release_id


# -- uploads over the wire --------------------------------------------------------------------
def test_chunk_limits_over_the_wire(server, client, tiny_checkpoint):
    big = b"\0" * (MAX_CHUNK_BYTES + 1)
    files = [f for f in manifest_of(tiny_checkpoint) if f.name != "model.safetensors"]
    import hashlib

    files.append(
        pb.FileEntry(name="model.safetensors", size=len(big), sha256=hashlib.sha256(big).hexdigest())
    )
    manifest = pb.UploadCheckpointRequest(manifest=pb.CheckpointManifest(files=files))
    chunk = pb.UploadCheckpointRequest(chunk=pb.FileChunk(name="model.safetensors", offset=0, data=big))
    code, reason = _code_and_reason(lambda: client.upload_messages([manifest, chunk]))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, errors.UPLOAD_TOO_LARGE)
    huge = pb.UploadCheckpointRequest(chunk=pb.FileChunk(name="model.safetensors", offset=0, data=big * 3))
    code, _ = _code_and_reason(lambda: client.upload_messages([manifest, huge]))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED  # refused by gRPC's message size limit
    store = server.node.store
    assert (
        not any(store.blobs.iterdir())
        and not any(store.checkpoints.iterdir())
        and not any(store.tmp.iterdir())
    )


# -- startup refusals -------------------------------------------------------------------------
def test_refuses_to_start_below_min_heldout_size(tmp_path, data_dir, pki):
    config = make_config(tmp_path, data_dir, pki, data={"min_heldout_size": HELDOUT_SIZE + 1})
    with pytest.raises(NodeStartupError, match=r"has 120 examples but data.min_heldout_size is 121"):
        open_node(config, scorer=FakeScorer())


def test_refuses_delta_not_below_one_over_n(tmp_path, data_dir, pki):
    config = make_config(tmp_path, data_dir, pki, privacy={"delta": 0.01})
    with pytest.raises(NodeStartupError, match=r"privacy.delta: must be below 1 / held-out size"):
        open_node(config, scorer=FakeScorer())


def test_refuses_insecure_off_loopback(tmp_path, data_dir, pki):
    config = make_config(tmp_path, data_dir, pki, tls=None, server={"insecure": True})
    with pytest.raises(ValueError, match="server.insecure"):
        start_server(config, "0.0.0.0:0", scorer=FakeScorer())


def test_refuses_corrupt_ledger(tmp_path, data_dir, pki):
    config = make_config(tmp_path, data_dir, pki)
    config.storage.dir.mkdir(parents=True)
    (config.storage.dir / "privacy_ledger.jsonl").write_text('{"type": "pending", "release_id": 1}\n')
    with pytest.raises(NodeStartupError, match="line 1 is corrupt"):
        open_node(config, scorer=FakeScorer())


# -- graceful shutdown ------------------------------------------------------------------------
def test_shutdown_reports_not_serving_and_refuses_new_calls(tmp_path, data_dir, pki):
    config = make_config(tmp_path, data_dir, pki)
    running = start_server(config, "localhost:0", scorer=FakeScorer())
    client = RecordingClient(running.port, pki)
    health = health_pb2_grpc.HealthStub(client.channel)
    assert (
        health.Check(health_pb2.HealthCheckRequest(service="")).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    stopper = threading.Thread(target=running.shutdown, kwargs={"grace_s": 1.0, "drain_delay_s": 1.5})
    stopper.start()
    try:
        time.sleep(0.3)
        status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert _code_and_reason(client.info) == (grpc.StatusCode.UNAVAILABLE, errors.SHUTTING_DOWN)
    finally:
        stopper.join()
        client.close()
