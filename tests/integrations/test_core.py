"""The engine-neutral core: the shared index stream, rewards -> groups, the release-only feedback step,
and the engine support check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from tests.trainer_node.test_policy_fakes import CLUSTERS, make_pool
from trainer_node.feedback.client import FeedbackError
from trainer_node.feedback.context import FeedbackSettings, connect_owner_feedback
from trainer_node.integrations.core import (
    EngineRun,
    GlobalIndexStream,
    ReleaseFeedback,
    cluster_ids,
    stage_checkpoint,
)
from trainer_node.integrations.support import (
    OWN_LOOP,
    TRAINING_ENGINES,
    EngineSupport,
    check_engine_support,
    engine_support,
    unsupported_reason,
)
from trainer_node.policies.base import build_policy, parse_policy_options

NO_CANDIDATES = EngineSupport(engine="trl", lookahead_candidates=False, any_policy=False)


# --- engine support -------------------------------------------------------------------------


def test_an_engine_without_candidates_refuses_lookahead_and_spsa_naming_the_field_and_fix():
    for estimator in ("lookahead", "spsa"):
        options = parse_policy_options({"name": "l2rr", "estimator": estimator})
        reason = unsupported_reason(options, NO_CANDIDATES)
        assert reason.startswith(f"policy.estimator: '{estimator}' needs lookahead candidates")
        assert "engine 'trl' cannot build" in reason and "'release_difference'" in reason
        with pytest.raises(ValueError, match="policy.estimator"):
            check_engine_support(options, NO_CANDIDATES)
        assert unsupported_reason(options, OWN_LOOP) is None  # our own loop serves both kinds


@pytest.mark.parametrize("table", [
    {"name": "l2rr", "estimator": "release_difference"},
    {"name": "l2rr", "estimator": "lookahead", "learn_q": False},  # no queries: nothing to build
    {"name": "uniform"},
])
def test_policies_that_need_no_candidates_pass(table):
    check_engine_support(parse_policy_options(table), NO_CANDIDATES)


@pytest.mark.parametrize("name", ["dapo", "greso", "ar3po"])
def test_policies_that_pick_prompts_themselves_need_the_own_loop(name):
    options = parse_policy_options({"name": name})
    assert unsupported_reason(options, NO_CANDIDATES).startswith(f"policy.name: {name!r} chooses its prompts")
    assert unsupported_reason(options, OWN_LOOP) is None


def test_engine_registry_declares_capabilities():
    assert engine_support("trainer_node") == OWN_LOOP
    assert TRAINING_ENGINES.get("trainer_node").extra is None


# --- the index stream -----------------------------------------------------------------------


def stream_for(pool, per_round=6, seed=11):
    cluster_of, names = cluster_ids(pool)
    return GlobalIndexStream(cluster_of, len(names), per_round, seed)


def test_every_rank_draws_the_same_rounds_from_the_same_q_and_seed():
    pool = make_pool(per_cluster=10)
    q = np.array([0.1, 0.2, 0.3, 0.4])
    rank0, rank1 = stream_for(pool), stream_for(pool)
    rounds0 = [rank0.round(r, q) for r in range(20)]
    # rank 1 asks in another order (a resumed or lagging rank): each round depends on (seed, number, q) only
    rounds1 = {r: rank1.round(r, q.copy()) for r in reversed(range(20))}
    assert rounds0 == [rounds1[r] for r in range(20)]
    assert all(len(set(chunk)) == 6 for chunk in rounds0)  # distinct prompts per round
    assert len({tuple(chunk) for chunk in rounds0}) > 15
    assert stream_for(pool, seed=12).round(0, q) != rounds0[0]


def test_rounds_follow_q_and_survive_an_exhausted_cluster():
    pool = make_pool(per_cluster=10)
    cluster_of, _ = cluster_ids(pool)
    stream = stream_for(pool, per_round=8)
    q = np.array([0.7, 0.1, 0.1, 0.1])
    counts = np.zeros(4)
    for r in range(400):
        counts += np.bincount(cluster_of[stream.round(r, q)], minlength=4)
    share = counts / counts.sum()
    assert share == pytest.approx(q, abs=0.02)
    # All of q on a 10-prompt cluster, 16 per round: the excess comes from the other clusters.
    big = stream_for(pool, per_round=16).round(0, np.array([1.0, 0.0, 0.0, 0.0]))
    assert len(set(big)) == 16 and np.bincount(cluster_of[big], minlength=4)[0] == 10


def test_bad_q_or_round_size_is_refused():
    pool = make_pool(per_cluster=2)
    with pytest.raises(ValueError, match="q must be 4 finite"):
        stream_for(pool, per_round=2).round(0, np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="q must be 4 finite"):
        stream_for(pool, per_round=2).round(0, np.array([np.nan, 0.5, 0.5, 0.0]))
    with pytest.raises(ValueError, match="prompts per round"):
        stream_for(pool, per_round=9)


# --- rewards -> groups -> the policy ------------------------------------------------------------


class FakeOwnerClient:
    """The five OwnerClient calls; releases a fixed accuracy sequence with a DP spend."""

    def __init__(self, accuracies, fail_upload=False):
        self.accuracies = list(accuracies)
        self.fail_upload = fail_upload
        self.uploaded: list[list[str]] = []
        self.evaluated: list[list[str]] = []
        self.last_upload_bytes = 0
        self.spent = 0.0

    def info(self):
        return pb.GetInfoResponse(privacy=pb.PrivacyParameters(enabled=True))

    def budget(self):
        return pb.GetBudgetResponse()

    def upload(self, model_dir, digests=None):
        if self.fail_upload:
            raise FeedbackError("owner down")
        self.uploaded.append(sorted(p.name for p in Path(model_dir).iterdir()))
        self.last_upload_bytes = sum(p.stat().st_size for p in Path(model_dir).iterdir())
        return f"ckpt-{len(self.uploaded)}"

    def evaluate(self, ids, decoding, split=pb.SPLIT_FEEDBACK):
        self.evaluated.append(list(ids))
        self.spent += 0.5
        accuracy = self.accuracies.pop(0)
        return pb.EvaluateResponse(
            results=[pb.CandidateResult(checkpoint_id=ids[0], accuracy=accuracy)],
            privacy=pb.PrivacySpend(epsilon_this_release=0.5, epsilon_spent_total=self.spent,
                                    epsilon_remaining=100.0 - self.spent, noise_std=0.01),
        )

    def close(self):
        pass


def engine_checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "training_args.bin", "optimizer.pt"):
        (folder / name).write_bytes(b"x" * 10)
    return folder


def release_feedback(tmp_path, client, steps=10):
    owner = connect_owner_feedback(client, None, FeedbackSettings(total_steps=steps, max_new_tokens=4, seed=0),
                                   tmp_path / "feedback")
    return ReleaseFeedback(owner, lambda: engine_checkpoint(tmp_path / "engine" / "checkpoint"), engine="fake")


def test_staging_keeps_only_allowlisted_files(tmp_path):
    staged = stage_checkpoint(engine_checkpoint(tmp_path / "ckpt"), tmp_path / "staged")
    assert sorted(p.name for p in staged.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FeedbackError, match="no safetensors"):
        stage_checkpoint(tmp_path / "empty", tmp_path / "staged2")
    with pytest.raises(FeedbackError, match="does not exist"):
        stage_checkpoint(tmp_path / "missing", tmp_path / "staged3")


def test_rewards_become_groups_and_the_waste_signal():
    pool = make_pool(per_cluster=4)
    policy = build_policy({"name": "l2rr", "estimator": "release_difference"}, pool, np.random.default_rng(0))
    run = EngineRun(policy, pool)
    assert pool.clusters[0] == "algebra" and pool.clusters[4] == pool.clusters[5] == "geometry"
    # prompt 0 all correct: zero variance; prompt 4 mixed; prompt 5 zero variance once its None is excluded
    counts = run.observe(0, [0, 0, 4, 4], [1.0, 1.0, 0.0, 1.0])
    counts2 = run.observe(0, [5, 5, 5], [0.0, None, 0.0])
    assert counts == {name: 0 for name in CLUSTERS} | {"algebra": 1}
    assert counts2 == {name: 0 for name in CLUSTERS} | {"geometry": 1}
    metrics = run.end_step(0)
    assert metrics["zero_variance_frac"] == pytest.approx(2 / 3)
    assert policy.history.waste[[0, 4, 5]].tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="outside the pool"):
        run.observe(1, [99], [1.0])
    with pytest.raises(ValueError, match="2 prompt indices for 1 rewards"):
        run.observe(1, [0, 0], [1.0])


def test_the_feedback_step_uploads_the_engines_checkpoint_and_moves_q(tmp_path):
    pool = make_pool(per_cluster=10)
    policy = build_policy({"name": "l2rr", "estimator": "release_difference", "eta_q": 0.5,
                           "max_staleness": 0},  # synchronous: each step's release is read in that step
                          pool, np.random.default_rng(0))
    client = FakeOwnerClient([0.30, 0.40, 0.20, 0.35])
    feedback = release_feedback(tmp_path, client)
    run = EngineRun(policy, pool, feedback)
    cluster_of, _ = cluster_ids(pool)
    algebra, logic = np.flatnonzero(cluster_of == 0), np.flatnonzero(cluster_of == 2)
    batches = [list(algebra[:3]) + list(logic[:1]), list(algebra[3:6]) + list(logic[1:2]),
               list(logic[2:6]), list(logic[6:9]) + list(algebra[6:7])]
    for step, batch in enumerate(batches):
        indices = [i for i in batch for _ in range(2)]
        run.observe(step, indices, [0.0, 1.0] * len(batch))  # every group informative
        run.end_step(step)
    assert len(client.uploaded) == 4 and all(len(ids) == 1 for ids in client.evaluated)  # base only
    assert "training_args.bin" not in client.uploaded[0] and "optimizer.pt" not in client.uploaded[0]
    assert feedback.stats.queries == 4 and feedback.stats.epsilon_spent == pytest.approx(2.0)
    assert feedback.stats.uploaded_bytes == 4 * 50
    # Algebra-heavy intervals raised accuracy, logic-heavy ones lowered it: q moves to algebra.
    q = policy.q()
    assert q[0] > 0.25 > q[2]
    assert not (tmp_path / "feedback" / "staged" / "upload-0").exists()  # staging removed after upload


def test_an_unreachable_owner_keeps_q_and_counts_a_failure(tmp_path):
    pool = make_pool(per_cluster=10)
    policy = build_policy({"name": "l2rr", "estimator": "release_difference", "max_staleness": 0},
                          pool, np.random.default_rng(0))
    feedback = release_feedback(tmp_path, FakeOwnerClient([], fail_upload=True))
    run = EngineRun(policy, pool, feedback)
    run.observe(0, [0, 0, 20, 20], [0.0, 1.0, 0.0, 1.0])
    run.end_step(0)
    assert feedback.stats.failures == 1 and policy.metrics()["feedback_failures"] == 1.0
    assert policy.q() == pytest.approx(np.full(4, 0.25))


def test_release_feedback_refuses_candidates(tmp_path):
    feedback = release_feedback(tmp_path, FakeOwnerClient([0.5]))
    with pytest.raises(RuntimeError, match="cannot build lookahead candidates"):
        feedback.candidates([], [[1.0]])
    assert feedback.release_current(3) == 0.5


def test_q_without_a_learnt_distribution_is_the_pools_share():
    pool = make_pool(per_cluster=3)
    run = EngineRun(build_policy({"name": "uniform"}, pool, np.random.default_rng(0)), pool)
    assert run.q() == pytest.approx(np.full(4, 0.25))


def test_the_config_edge_refuses_what_the_engine_cannot_serve():
    from rlvr_core.configuration import ConfigError
    from trainer_node.config import parse_config

    base = {"model": {"tiny": True}, "engine": {"name": "trl"}}
    with pytest.raises(ConfigError, match=r"policy\.estimator: 'lookahead' needs lookahead candidates .* engine 'trl'"):
        parse_config({**base, "policy": {"name": "l2rr"}})
    with pytest.raises(ConfigError, match=r"policy\.name: 'greso' chooses its prompts itself"):
        parse_config({**base, "policy": {"name": "greso"}})
    with pytest.raises(ConfigError, match=r"engine\.options\.loss_typ: not an option of training engine 'trl'; "
                                          r"did you mean 'loss_type'"):
        parse_config({**base, "engine": {"name": "trl", "options": {"loss_typ": "grpo"}},
                      "policy": {"name": "uniform"}})
    with pytest.raises(ConfigError, match=r"engine\.name: unknown training engine 'tlr'; known: trainer_node, trl"):
        parse_config({"model": {"tiny": True}, "engine": {"name": "tlr"}})
    config = parse_config({**base, "policy": {"name": "l2rr", "estimator": "release_difference"}})
    assert config.engine.options.loss_type == "dapo" and config.to_json()["engine"]["name"] == "trl"
    assert parse_config({"model": {"tiny": True}}).engine.name == "trainer_node"  # the default: our own loop


def test_only_rank_zero_writes_the_run_folder_of_a_multi_process_launch(monkeypatch, tmp_path):
    from trainer_node.training import rank_output_dir

    assert TRAINING_ENGINES.get("trainer_node").process_rank() == 0
    monkeypatch.setenv("RANK", "3")  # as torchrun / accelerate launch set it
    assert TRAINING_ENGINES.get("trainer_node").process_rank() == 0  # one process, whatever the env says
    assert TRAINING_ENGINES.get("trl").process_rank() == 3
    monkeypatch.delenv("RANK")
    assert TRAINING_ENGINES.get("trl").process_rank() == 0
    assert rank_output_dir(tmp_path, 0) == tmp_path
    assert rank_output_dir(tmp_path, 3) == tmp_path / "rank3"
