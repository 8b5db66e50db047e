"""Metrics, logs and health checks of a served owner node, and that none carries data.

The held-out rows carry canaries; one evaluation fails with an exception whose text quotes
a canary (a buggy verifier). Neither /metrics nor the JSON log may contain any canary.
"""

from __future__ import annotations

import io
import json
import re
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from target_owner_node import healthcheck, logs
from target_owner_node.metrics import OwnerMetrics
from trainer_node.feedback.client import BudgetExhausted, FeedbackError, TargetFeedbackClient

from .conftest import StubScorer, canary, client_settings, decoding, in_process_owner, owner_config

LABEL = re.compile(r"(\w+)=\"([^\"]*)\"")


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def _value(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"{name}{labels} not in metrics")


@pytest.fixture()
def log_stream():
    stream = io.StringIO()
    logs.configure(stream=stream)
    yield stream
    logs.configure()


def test_metrics_logs_and_health_carry_no_data(tmp_path, data_dir, two_orgs, tiny_checkpoint, log_stream):
    raw = owner_config(
        tmp_path / "storage", data_dir, two_orgs,
        privacy={"planned_releases": 2, "epsilon_budget": 1.0},
        server={"health_address": "127.0.0.1:0"},
        metrics={"port": 0},
    )
    scorer = StubScorer()
    with in_process_owner(raw, tmp_path, scorer) as running:
        assert running.metrics_endpoint.host == "127.0.0.1", "loopback by default"
        settings = client_settings(two_orgs, f"localhost:{running.port}", evaluate_deadline_s=60)
        with TargetFeedbackClient(settings) as client:
            client.info()
            checkpoint_id = client.upload(tiny_checkpoint)
            first = client.evaluate([checkpoint_id], decoding(), request_id="r1")
            client.evaluate([checkpoint_id], decoding(), request_id="r1")  # replay: no new spend
            scorer.fail_next = RuntimeError(f"verifier crashed on {canary(3)} / {canary(4)}")
            with pytest.raises(FeedbackError) as internal:
                client.evaluate([checkpoint_id], decoding(), request_id="r2")
            assert internal.value.code == grpc.StatusCode.UNAVAILABLE  # the one post-charge error
            assert "CANARY" not in str(internal.value)
            client.evaluate([checkpoint_id], decoding(), request_id="r2")  # resumed: charged once
            with pytest.raises(BudgetExhausted):
                client.evaluate([checkpoint_id], decoding(), request_id="r3")
            budget = client.budget()

        text = _scrape(running.metrics_endpoint.port)
        assert _value(text, "target_owner_rpc_requests_total", rpc="Evaluate") == 5
        assert _value(text, "target_owner_rpc_errors_total", rpc="Evaluate", code="UNAVAILABLE") == 1
        assert _value(text, "target_owner_rpc_errors_total", rpc="Evaluate", code="RESOURCE_EXHAUSTED") == 1
        assert _value(text, "target_owner_rpc_requests_total", rpc="UploadCheckpoint") == 1
        assert _value(text, "target_owner_releases_total") == 2
        assert _value(text, "target_owner_dp_releases_total") == 2
        assert _value(text, "target_owner_release_replays_total") == 1
        # No Evaluate timing is published: durations exist for the other RPCs only.
        assert "target_owner_evaluation_duration" not in text
        assert 'target_owner_rpc_duration_seconds_count{rpc="Evaluate"}' not in text
        assert _value(text, "target_owner_rpc_duration_seconds_count", rpc="UploadCheckpoint") == 1
        assert _value(text, "target_owner_evaluations_in_flight") == 0
        assert _value(text, "target_owner_upload_bytes_total") > 0
        assert _value(text, "target_owner_epsilon_spent") == pytest.approx(budget.epsilon_spent)
        assert _value(text, "target_owner_epsilon_remaining") == pytest.approx(budget.epsilon_remaining)
        assert _value(text, "target_owner_epsilon_budget") == 1.0
        assert _value(text, "target_owner_dp_releases_made") == budget.releases_made == 2
        assert first.privacy.epsilon_spent_total > 0
        assert "CANARY" not in text
        label_names = {name for name, _ in LABEL.findall(text)} - {"le"}  # le: histogram buckets
        assert label_names == {"rpc", "code"}

        # The health-only port: plaintext, health only, same state as the mTLS port.
        health_address = f"127.0.0.1:{running.health_port}"
        assert healthcheck.main(["--address", health_address]) == 0
        with grpc.insecure_channel(health_address) as channel:
            info = channel.unary_unary(
                "/target_feedback.v1.TargetFeedbackService/GetInfo",
                request_serializer=pb.GetInfoRequest.SerializeToString,
                response_deserializer=pb.GetInfoResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as refused:
                info(pb.GetInfoRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # over mTLS, as the trainer's side could probe it
        probe = ["--address", f"localhost:{running.port}", "--ca", str(two_orgs.owner_ca_cert),
                 "--cert", str(two_orgs.client_cert), "--key", str(two_orgs.client_key)]
        assert healthcheck.main(probe) == 0
        running.health.enter_graceful_shutdown()
        with grpc.insecure_channel(health_address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert healthcheck.main(["--address", health_address]) == 1
    assert healthcheck.main(["--address", health_address, "--timeout", "1"]) == 1  # gone

    lines = log_stream.getvalue().splitlines()
    assert lines and all(isinstance(json.loads(line), dict) for line in lines)
    events = [json.loads(line)["event"] for line in lines]
    assert "evaluation_incomplete" in events and "release_replayed" in events
    assert "CANARY" not in log_stream.getvalue()


def test_labels_outside_the_known_set_become_other():
    metrics = OwnerMetrics()
    metrics.observe_rpc(f"GetInfo {canary(1)}", f"weird {canary(2)}", 0.1)
    text = metrics.render().decode()
    assert "CANARY" not in text
    assert _value(text, "target_owner_rpc_errors_total", rpc="other", code="other") == 1


def test_metrics_off_by_default_and_health_from_config(tmp_path, data_dir, two_orgs):
    from target_owner_node.config import parse_config

    config = parse_config(owner_config(tmp_path, data_dir, two_orgs), tmp_path)
    assert config.metrics.port is None and config.metrics.host == "127.0.0.1"
    assert config.server.health_address is None
    config_file = tmp_path / "c.toml"
    config_file.write_text('[data]\nheldout_path = "h.jsonl"\n[storage]\ndir = "s"\n[server]\ninsecure = true\n')
    assert healthcheck.main(["--config", str(config_file)]) == 1  # no health_address: says how to add one
    with pytest.raises(Exception, match="metrics.port"):
        parse_config(owner_config(tmp_path, data_dir, two_orgs, metrics={"port": 70000}), tmp_path)
