"""The release_difference estimator: by hand, folded failures, resume, and learning q through the run loop."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from tests.trainer_node.test_policy_fakes import CLUSTERS, FakeOracle, make_pool, run_step
from trainer_node.policies.base import AnsweredFeedback, build_policy, send_query
from trainer_node.policies.l2rr_estimators import (
    EstimatorSettings,
    ReleaseDifferenceEstimator,
    build_estimator,
    candidate_free_estimators,
    estimator_class,
)


def test_capabilities_split_the_estimators():
    assert estimator_class("lookahead").needs_candidates and estimator_class("spsa").needs_candidates
    assert not estimator_class("release_difference").needs_candidates
    assert candidate_free_estimators() == ["release_difference"]


def test_regression_by_hand():
    s = EstimatorSettings(release_decay=0.5, release_ridge=0.1, release_baseline_beta=0.8)
    est = ReleaseDifferenceEstimator(s)
    q = np.array([0.5, 0.5])
    first = est.plan([], np.zeros(0), q, np.random.default_rng(0))
    assert first.weights == []  # one checkpoint per query: the base
    assert not first.conclude([0.40]).observed.any()  # the first release is only the reference
    est.record_training(np.array([0, 0, 0, 1]), q)  # share (0.75, 0.25): deviation (+0.25, -0.25)
    est.record_training(np.array([0, 1]), q)  # deviation 0
    second = est.plan([], np.zeros(0), q, np.random.default_rng(0))
    estimate = second.conclude([0.46])
    # No baseline yet: residual 0, the baseline learns 0.06 / 2 per update.
    assert est.baseline == pytest.approx(0.2 * 0.03) and not estimate.grad.any()
    d2 = np.array([0.25, -0.25])
    assert est.gram == pytest.approx(np.outer(d2, d2))
    est.record_training(np.array([1, 1]), q)  # deviation (-0.5, +0.5)
    third = est.plan([], np.zeros(0), q, np.random.default_rng(0))
    estimate = third.conclude([0.42])
    residual = (0.42 - 0.46) - 1 * 0.03  # bias-corrected baseline: 0.006 / (1 - 0.8) = 0.03 per update
    d3 = np.array([-0.5, 0.5])
    gram = 0.5 * np.outer(d2, d2) + np.outer(d3, d3)
    moment = residual * d3
    ridge = 0.1 * np.mean(np.diag(gram))
    assert estimate.grad == pytest.approx(np.linalg.solve(gram + ridge * np.eye(2), moment))
    assert estimate.grad[0] > 0 > estimate.grad[1]  # training cluster 1 lowered accuracy
    assert estimate.observed.tolist() == [True, True]


def test_a_failed_query_folds_its_interval_into_the_next():
    est = ReleaseDifferenceEstimator(EstimatorSettings())
    q = np.array([0.5, 0.5])
    est.plan([], np.zeros(0), q, None).conclude([0.5])
    est.record_training(np.array([0]), q)
    est.plan([], np.zeros(0), q, None)  # its release never comes (None: conclude not called)
    est.record_training(np.array([0]), q)
    third = est.plan([], np.zeros(0), q, None)
    assert len(est.segments) == 2
    third.conclude([0.6])
    assert est.segments == [] and est.gram == pytest.approx(np.outer([1.0, -1.0], [1.0, -1.0]))
    assert est.baseline == pytest.approx(0.2 * 0.05)  # 0.1 over 2 updates


def test_state_round_trips_mid_interval_and_bad_state_is_refused():
    est = ReleaseDifferenceEstimator(EstimatorSettings())
    q = np.array([0.2, 0.3, 0.5])
    est.plan([], np.zeros(0), q, None).conclude([0.3])
    est.record_training(np.array([0, 2]), q)
    est.plan([], np.zeros(0), q, None)
    est.record_training(np.array([1]), q)
    state = json.loads(json.dumps(est.state_dict()))
    twin = build_estimator("release_difference", EstimatorSettings())
    twin.load_state_dict(state)
    assert twin.state_dict() == est.state_dict()
    state["segments"][0][1] = [0.0]
    with pytest.raises(ValueError, match="segment"):
        build_estimator("release_difference", EstimatorSettings()).load_state_dict(state)


@dataclass
class TrainedMixOwner:
    """An owner whose accuracy moves with what the model was TRAINED on: after each update,
    acc += lr * sum_c share_c * value_c (no candidates); every release adds DP-like noise."""

    values: dict[str, float]
    lr: float = 0.02
    noise: float = 0.0
    seed: int = 0
    accuracy: float = 0.3
    releases: list[int] = field(default_factory=list)
    candidate_sets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def train(self, batch: Sequence[Any]) -> None:
        if batch:
            self.accuracy += self.lr * sum(self.values.get(g.cluster, 0.0) for g in batch) / len(batch)

    def should_query(self, step: int) -> bool:
        return step % 3 == 0

    def candidates(self, batch, weights):
        self.candidate_sets.append(len(weights))
        return []

    def evaluate(self, candidates):
        assert candidates == []
        self.releases.append(1)
        return [self.accuracy + self.rng.normal(0, self.noise)]


def test_learns_q_from_releases_of_the_current_model_through_the_run_loop_seam():
    pool = make_pool(per_cluster=20)
    oracle = FakeOracle(pool, seed=2, rates=np.full(len(pool), 0.5))
    policy = build_policy({"name": "l2rr", "batch_size": 8, "rollouts_per_prompt": 4,
                           "estimator": "release_difference", "eta_q": 0.3, "max_staleness": 0},
                          pool, np.random.default_rng(3))
    owner = TrainedMixOwner({"logic": 1.0, "algebra": -0.5}, noise=0.0005, seed=4)
    for step in range(90):
        record = run_step(policy, step, oracle, owner)  # before_update: the release, then this batch
        owner.train(record.batch)
    q = policy.q()
    assert q[CLUSTERS.index("logic")] == q.max() and q[CLUSTERS.index("algebra")] == q.min()
    assert owner.candidate_sets == [] and len(owner.releases) == 30  # one checkpoint per query, nothing built


def test_after_update_queries_about_the_model_with_the_batch_trained():
    pool = make_pool(per_cluster=20)
    oracle = FakeOracle(pool, seed=2, rates=np.full(len(pool), 0.5))
    policy = build_policy({"name": "l2rr", "batch_size": 8, "rollouts_per_prompt": 4,
                           "estimator": "release_difference", "eta_q": 0.3, "max_staleness": 0},
                          pool, np.random.default_rng(3))
    owner = TrainedMixOwner({"logic": 1.0, "algebra": -0.5}, noise=0.0005, seed=4)
    for step in range(90):
        record = run_step(policy, step, oracle, None)  # an engine's step: no feedback inside it
        owner.train(record.batch)  # the engine's update
        policy.after_update(step, record.batch, owner)
    q = policy.q()
    assert q[CLUSTERS.index("logic")] == q.max() and q[CLUSTERS.index("algebra")] == q.min()


def test_after_update_refuses_an_estimator_that_needs_candidates():
    pool = make_pool(per_cluster=4)
    policy = build_policy({"name": "l2rr", "estimator": "lookahead"}, pool, np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="policy.estimator = 'lookahead' needs lookahead candidates"):
        policy.after_update(0, [], TrainedMixOwner({}))
    policy.after_update(0, [], None)  # without feedback it only records


class NoCandidates:
    """A context whose candidate builder must not be called (our trainer refuses an empty batch)."""

    def __init__(self):
        self.submitted: list[list] = []

    def candidates(self, batch, weights):
        raise AssertionError("no candidates are built for a query of the current model")

    def evaluate(self, candidates):
        return [0.5 + len(candidates)]

    def submit(self, candidates):
        self.submitted.append(list(candidates))
        return AnsweredFeedback([0.25])

    def submit_lookahead(self, batch, weights):
        raise AssertionError("no lookahead snapshot for a query of the current model")


def test_a_query_without_candidates_releases_the_current_model_alone():
    context = NoCandidates()
    assert send_query(context, [], [], asynchronous=False).result() == [0.5]
    assert send_query(context, [], [], asynchronous=True).result() == [0.25]
    assert context.submitted == [[]]
