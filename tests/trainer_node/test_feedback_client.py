"""The feedback client retries only UNAVAILABLE (unary calls through grpc's own retry policy) and never
RESOURCE_EXHAUSTED, UNAUTHENTICATED or PERMISSION_DENIED."""

from concurrent import futures

import grpc
import pytest

from protocol import errors
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.generated.target_feedback.v1 import target_feedback_pb2_grpc as pb_grpc
from trainer_node.feedback.client import (
    BudgetExhausted,
    ClientSettings,
    FeedbackError,
    OwnerRefused,
    OwnerUnavailable,
    TargetFeedbackClient,
    retry_service_config,
)


class ScriptedServicer(pb_grpc.TargetFeedbackServiceServicer):
    """Fails the first `failures` Evaluate calls with `code`/`reason`, then succeeds."""

    def __init__(self, code, reason, failures):
        self.code, self.reason, self.failures = code, reason, failures
        self.evaluate_calls = 0
        self.request_ids = []
        self.uploads = []

    def Evaluate(self, request, context):
        self.evaluate_calls += 1
        self.request_ids.append(request.request_id)
        if self.evaluate_calls <= self.failures:
            context.abort_with_status(errors.ProtocolError(self.code, self.reason, "scripted failure").to_status())
        return pb.EvaluateResponse(results=[pb.CandidateResult(checkpoint_id=i, accuracy=0.5) for i in request.checkpoint_ids])

    def UploadCheckpoint(self, request_iterator, context):
        messages = list(request_iterator)
        manifest = messages[0].manifest
        sent = {m.chunk.name for m in messages[1:]}
        self.uploads.append(sent)
        return pb.UploadCheckpointResponse(checkpoint_id="ck-" + "-".join(sorted(f.sha256[:6] for f in manifest.files)))


@pytest.fixture
def serve():
    servers = []

    def start(servicer):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_TargetFeedbackServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        sleeps = []
        client = TargetFeedbackClient(
            ClientSettings(target=f"127.0.0.1:{port}", insecure=True, max_attempts=4), sleep=sleeps.append
        )
        return client, sleeps

    yield start
    for server in servers:
        server.stop(None)


def test_unavailable_is_retried_by_grpc_with_the_same_request_id(serve):
    servicer = ScriptedServicer(grpc.StatusCode.UNAVAILABLE, errors.SHUTTING_DOWN, failures=2)
    client, sleeps = serve(servicer)
    response = client.evaluate(["a"], pb.DecodingSettings(max_new_tokens=4, samples_per_prompt=1))
    assert response.results[0].accuracy == 0.5
    assert servicer.evaluate_calls == 3
    assert len(set(servicer.request_ids)) == 1, "retries must reuse the idempotency key"
    assert sleeps == [], "unary calls are retried by grpc's retry policy, not by a loop in the client"


def test_unavailable_gives_up_after_max_attempts(serve):
    servicer = ScriptedServicer(grpc.StatusCode.UNAVAILABLE, errors.SHUTTING_DOWN, failures=99)
    client, _ = serve(servicer)
    with pytest.raises(OwnerUnavailable, match="after up to 4 attempts"):
        client.evaluate(["a"], pb.DecodingSettings())
    assert servicer.evaluate_calls == 4


def test_the_retry_policy_is_the_channels_service_config():
    config = retry_service_config(5, 0.5, 8.0)["methodConfig"][0]
    assert {name["method"] for name in config["name"]} == {"GetInfo", "GetBudget", "Evaluate"}
    assert config["retryPolicy"] == {"maxAttempts": 5, "initialBackoff": "0.5s", "maxBackoff": "8s",
                                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
    assert "retryPolicy" not in retry_service_config(1, 0.5, 8.0)["methodConfig"][0]


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED])
def test_refusals_are_never_retried(serve, code):
    servicer = ScriptedServicer(code, errors.CLIENT_NOT_ALLOWED, failures=1)
    client, sleeps = serve(servicer)
    with pytest.raises(OwnerRefused) as info:
        client.evaluate(["a"], pb.DecodingSettings())
    assert info.value.code == code and servicer.evaluate_calls == 1 and sleeps == []


def test_resource_exhausted_is_never_retried(serve):
    servicer = ScriptedServicer(grpc.StatusCode.RESOURCE_EXHAUSTED, errors.PRIVACY_BUDGET_EXHAUSTED, failures=1)
    client, sleeps = serve(servicer)
    with pytest.raises(BudgetExhausted) as info:
        client.evaluate(["a"], pb.DecodingSettings())
    assert info.value.reason == errors.PRIVACY_BUDGET_EXHAUSTED
    assert servicer.evaluate_calls == 1 and sleeps == []


def test_invalid_argument_is_not_retried(serve):
    servicer = ScriptedServicer(grpc.StatusCode.INVALID_ARGUMENT, errors.UNKNOWN_CHECKPOINT, failures=1)
    client, _ = serve(servicer)
    with pytest.raises(FeedbackError) as info:
        client.evaluate(["a"], pb.DecodingSettings())
    assert info.value.reason == errors.UNKNOWN_CHECKPOINT and servicer.evaluate_calls == 1


def test_upload_sends_only_changed_files(serve, tmp_path):
    servicer = ScriptedServicer(grpc.StatusCode.OK, "", failures=0)
    client, _ = serve(servicer)
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    (tmp_path / "model.safetensors").write_bytes(b"weights-v1")
    client.upload(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"weights-v2")
    client.upload(tmp_path)
    assert servicer.uploads[0] == {"config.json", "model.safetensors"}
    assert servicer.uploads[1] == {"model.safetensors"}


def test_upload_refuses_disallowed_files(serve, tmp_path):
    client, _ = serve(ScriptedServicer(grpc.StatusCode.OK, "", failures=0))
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(FeedbackError, match="not an allowed checkpoint file"):
        client.upload(tmp_path)


def test_hand_serialized_chunks_are_the_generated_bytes():
    import os

    from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
    from trainer_node.feedback.client import chunk_message

    for offset in (0, 5, 1 << 40):
        for size in (0, 1, 127, 128, 1 << 20):
            data = os.urandom(size)
            expected = pb.UploadCheckpointRequest(
                chunk=pb.FileChunk(name="model-00001-of-00050.safetensors", offset=offset, data=data)
            ).SerializeToString()
            assert chunk_message("model-00001-of-00050.safetensors", offset, data) == expected


def test_given_digests_are_used_and_a_same_tick_rewrite_is_hashed_again(serve, tmp_path):
    import hashlib

    servicer = ScriptedServicer(grpc.StatusCode.OK, "", failures=0)
    client, _ = serve(servicer)
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights-v1")
    given = {"model.safetensors": hashlib.sha256(b"weights-v1").hexdigest()}
    client.upload(tmp_path, given)
    weights.write_bytes(b"weights-v2")  # same inode, same size, maybe the same mtime tick
    client.upload(tmp_path)
    assert servicer.uploads[1] == {"model.safetensors"}, "a rewrite must never be taken for the file hashed before"
    assert client.last_upload_bytes >= 0
