"""The real evaluation path: server -> spawned worker process -> tiny model -> verifier."""

from __future__ import annotations

import math
import shutil

import pytest

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

from .conftest import RecordingClient, assert_no_canary, make_config, running_server, upload_messages


@pytest.fixture(scope="module")
def worker_server(tmp_path_factory, data_dir, pki):
    tmp = tmp_path_factory.mktemp("worker-node")
    config = make_config(
        tmp,
        data_dir,
        pki,
        privacy={"planned_releases": 20, "epsilon_budget": 4.0},
        evaluation={"batch_size": 64, "timeout_s": 300},
    )
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def two_checkpoints(worker_server, pki, tiny_checkpoint, tmp_path_factory):
    """The tiny policy, and the same weights under another id (another generation_config.json)."""
    twin = tmp_path_factory.mktemp("twin") / "tiny"
    shutil.copytree(tiny_checkpoint, twin)
    (twin / "generation_config.json").write_text('{"do_sample": false, "twin": 1}')
    client = RecordingClient(worker_server.port, pki)
    try:
        first = client.upload_dir(tiny_checkpoint)
        held = {p.name for p in tiny_checkpoint.iterdir()} - {"generation_config.json"}
        second = client.upload_messages(upload_messages(twin, skip=held))  # only the changed file travels
        assert set(second.reused_files) == held and second.bytes_received == len(
            '{"do_sample": false, "twin": 1}'
        )
        assert_no_canary(client.received)
    finally:
        client.close()
    return first.checkpoint_id, second.checkpoint_id


def test_real_evaluation_is_paired_and_leaks_nothing(worker_server, two_checkpoints, pki):
    a, b = two_checkpoints
    client = RecordingClient(worker_server.port, pki)
    try:
        test = client.evaluate([a, b], split=pb.SPLIT_TEST, samples_per_prompt=2, temperature=1.0, seed=7)
        accuracies = [r.accuracy for r in test.results]
        assert all(0.0 <= x <= 1.0 for x in accuracies)
        assert accuracies[0] == accuracies[1], "identical weights with one seed must score identically"
        assert set(test.results[0].domain_accuracy) == {"easy", "hard"}
        again = client.evaluate([a], split=pb.SPLIT_TEST, samples_per_prompt=2, temperature=1.0, seed=7)
        assert again.results[0].accuracy == accuracies[0], "same seed, same generations"

        feedback = client.evaluate([a, b], request_id="real-1", max_new_tokens=4)
        assert feedback.privacy.epsilon_this_release > 0 and feedback.privacy.noise_std > 0
        assert all(math.isfinite(r.accuracy) for r in feedback.results)
        replay = client.evaluate([a, b], request_id="real-1", max_new_tokens=4)
        assert [r.accuracy for r in replay.results] == [r.accuracy for r in feedback.results]
        assert client.budget().releases_made == 1
    finally:
        client.close()
    assert_no_canary(client.received)


def test_a_checkpoint_that_cannot_load_is_refused_at_upload_by_the_dry_run(worker_server, pki, tiny_checkpoint,
                                                                          tmp_path):
    """Static checks pass (valid files, allowlisted keys) but the weights do not fit the config:
    the dry run on public probe prompts refuses it at upload, so no evaluation can fail later
    (after a charge) for a reason knowable now. Nothing is stored."""
    import json

    import grpc

    from protocol import errors
    from protocol.errors import reason_of

    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] = config["intermediate_size"] * 2  # the MLP weights no longer fit
    (broken / "config.json").write_text(json.dumps(config))
    stored = sorted(p.name for p in (worker_server.node.config.storage.dir / "checkpoints").iterdir())
    client = RecordingClient(worker_server.port, pki)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            client.upload_dir(broken)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason_of(refused.value) == errors.INVALID_CHECKPOINT
        assert "dry run" in refused.value.details()
        assert_no_canary(client.received)
    finally:
        client.close()
    assert sorted(p.name for p in (worker_server.node.config.storage.dir / "checkpoints").iterdir()) == stored


def test_info_publishes_the_fixed_shape_parameters(worker_server, pki):
    """GetInfo declares the public prompt width and rows per query (q = 1 here: all N rows)."""
    assert worker_server.node.releases.rows_per_query == worker_server.node.facts.heldout_size
    info_client = RecordingClient(worker_server.port, pki)
    try:
        info = info_client.info()
    finally:
        info_client.close()
    assert info.privacy.rows_per_query == worker_server.node.facts.heldout_size
    assert info.decoding_limits.max_prompt_tokens == worker_server.node.config.evaluation.max_prompt_tokens
    assert 0 < info.privacy.row_cap_tail < 1


def test_real_difference_releases_through_the_worker(tmp_path, data_dir, pki, tiny_checkpoint):
    """Every metric through the spawned worker, exactly (DP off): identical weights under another
    id differ from the base by exactly 0 on every row; a perturbed candidate stays within the clip,
    and moves the reference answer's probability (the random policy samples no correct answer, so
    the sampling metrics have no reward to weigh); the response carries only numbers."""
    import json

    import numpy as np
    from safetensors.numpy import load_file, save_file

    config = make_config(tmp_path, data_dir, pki, privacy={"enabled": False},
                         evaluation={"batch_size": 64, "timeout_s": 300})
    moved = tmp_path / "moved"
    shutil.copytree(tiny_checkpoint, moved)
    weights = load_file(str(moved / "model.safetensors"))
    rng = np.random.default_rng(0)
    weights = {k: (v + rng.normal(0, 0.05, v.shape)).astype(v.dtype) for k, v in weights.items()}
    save_file(weights, str(moved / "model.safetensors"), metadata={"format": "pt"})
    (moved / "generation_config.json").write_text(json.dumps({"do_sample": False, "moved": 1}))
    twin = tmp_path / "twin"
    shutil.copytree(tiny_checkpoint, twin)
    (twin / "generation_config.json").write_text('{"do_sample": false, "twin": 1}')
    with running_server(config) as running:
        client = RecordingClient(running.port, pki)
        try:
            a, b, c = (client.upload_dir(d).checkpoint_id for d in (tiny_checkpoint, twin, moved))
            for metric, decoding in (("answer_probability", {}),
                                     ("importance", {"temperature": 1.0, "samples_per_prompt": 2}),
                                     ("log_ratio", {"temperature": 1.0, "samples_per_prompt": 2})):
                response = client.evaluate_difference([a, b, c], metric=metric, clip=0.05, max_new_tokens=4,
                                                      **decoding)
                assert response.kind == pb.RELEASE_KIND_ACCURACY_DIFFERENCE
                assert [r.checkpoint_id for r in response.results] == [b, c]
                twin_value, moved_value = (r.accuracy_difference for r in response.results)
                assert twin_value == 0.0, metric
                assert abs(moved_value) <= 0.05, metric
                if metric == "answer_probability":
                    assert moved_value != 0.0
                assert response.privacy.noise_std == 0.0
        finally:
            client.close()
    assert_no_canary(client.received)
