"""How the simulated owner decodes the TEST split for a run's before/after accuracy:
`[simulated_owner] test_samples_per_prompt` and `test_temperature` (greedy by default; avg@k of
k sampled answers otherwise). Both reach the Evaluate request of every test measurement."""

from __future__ import annotations

import pytest

from lab.configs import simulate_defaults_path
from lab.evaluation import TEST_SEED, OwnerTestEvaluation, owner_test_decoding
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from rlvr_core.configuration import load_toml
from trainer_node.config import ConfigError, parse_config, with_overrides


def _config(**owner):
    return parse_config(with_overrides(load_toml(simulate_defaults_path()),
                                       {f"simulated_owner.{key}": value for key, value in owner.items()}))


def test_the_default_is_greedy_and_the_resolved_config_records_it(tmp_path):
    config = _config()
    decoding = owner_test_decoding(config)
    assert (decoding.samples_per_prompt, decoding.temperature, decoding.seed) == (1, 0.0, TEST_SEED)
    assert decoding.max_new_tokens == config.rollout.max_new_tokens
    resolved = config.save_resolved(tmp_path).read_text()
    assert '"test_samples_per_prompt": 1' in resolved and '"test_temperature": 0.0' in resolved


def test_k_samples_at_a_temperature_reach_the_decoding():
    decoding = owner_test_decoding(_config(test_samples_per_prompt=4, test_temperature=1.0))
    assert (decoding.samples_per_prompt, decoding.temperature) == (4, 1.0)


@pytest.mark.parametrize(("owner", "message"), [
    ({"test_samples_per_prompt": 0}, r"simulated_owner\.test_samples_per_prompt"),
    ({"test_samples_per_prompt": 9, "test_temperature": 1.0}, r"simulated_owner\.test_samples_per_prompt"),
    ({"test_temperature": -0.5}, r"simulated_owner\.test_temperature"),
    ({"test_samples_per_prompt": 4}, r"simulated_owner.*same greedy answer.*test_temperature > 0"),
])
def test_bad_test_decoding_names_the_field(owner, message):
    with pytest.raises(ConfigError, match=message):
        _config(**owner)


class _RecordingClient:
    def __init__(self):
        self.requests = []

    def evaluate(self, checkpoint_ids, decoding, split):
        self.requests.append((list(checkpoint_ids), decoding, split))
        result = pb.CandidateResult(accuracy=0.5)
        result.domain_accuracy["math"] = 0.25
        return pb.EvaluateResponse(results=[result])


class _Feedback:
    def upload_current(self, label):
        return f"ckpt-{label}"


def test_every_test_measurement_sends_the_configured_decoding():
    decoding = owner_test_decoding(_config(test_samples_per_prompt=3, test_temperature=0.7))
    client = _RecordingClient()
    evaluation = OwnerTestEvaluation(client, _Feedback(), decoding)
    record = evaluation.evaluate("before")
    evaluation.evaluate_checkpoint("chosen", "target_test_selected")
    assert record == {"name": "target_test", "accuracy": 0.5, "accuracy/math": 0.25}
    assert [(ids, split) for ids, _, split in client.requests] == [
        (["ckpt-before"], pb.SPLIT_TEST), (["chosen"], pb.SPLIT_TEST)]
    for _, sent, _ in client.requests:
        assert (sent.samples_per_prompt, sent.temperature, sent.seed) == (3, pytest.approx(0.7), TEST_SEED)


def test_the_end_of_run_summary_names_a_sampled_test_decoding(tmp_path):
    from lab.simulate import format_summary

    summary = {"method": "uniform", "testbed": "small", "seed": 0, "steps": 2, "target_accuracy_before": 0.5,
               "target_accuracy_after": 0.625, "rollouts": 10, "epsilon_spent": 0.0, "epsilon_budget": 0.0,
               "dp_enabled": False, "feedback_queries": 0, "feedback_failures": 0, "wall_seconds": 1.0}
    assert "(+0.125, measured by the owner process)" in format_summary(summary, tmp_path)
    sampled = {**summary, "target_test_decoding": {"samples_per_prompt": 4, "temperature": 1.0}}
    assert "(+0.125, avg@4 at temperature 1, measured by the owner process)" in format_summary(sampled, tmp_path)


def test_both_simulation_summaries_name_a_sampled_test_decoding():
    from lab.evaluation import sampled_decoding_summary

    assert sampled_decoding_summary(_config()) == {}  # greedy: summaries stay as published
    assert sampled_decoding_summary(_config(test_samples_per_prompt=4, test_temperature=1.0)) == {
        "target_test_decoding": {"samples_per_prompt": 4, "temperature": 1.0}}


def test_the_federation_end_of_run_lines_name_a_sampled_test_decoding(tmp_path):
    from lab.federation import format_owners

    owner = {"target_accuracy_before": 0.5, "target_accuracy_after": 0.625, "target_domains": ["math"],
             "epsilon_spent": 0.0, "queries": 3, "lost_step": None}
    summary = {"method": "uniform", "num_owners": 1, "aggregation": "mean", "testbed": "small", "seed": 0,
               "steps": 2, "owners": {"owner-0": owner}, "wall_seconds": 1.0}
    assert "0.500 -> 0.625 (measured by its owner process)" in format_owners(summary, tmp_path)
    sampled = {**summary, "target_test_decoding": {"samples_per_prompt": 4, "temperature": 1.0}}
    assert "0.500 -> 0.625 (avg@4 at temperature 1, measured by its owner process)" in format_owners(sampled, tmp_path)
