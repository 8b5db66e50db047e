"""Fakes for the data-policy tests: a synthetic pool, a reward oracle, a feedback owner.

Kept in a test_policy* module (the policy tests' file pattern); the few tests at the bottom
check the fakes themselves, so a broken fake cannot make a policy test pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlvr_core.tasks.example import Example
from trainer_node.policies.base import (
    DataPolicy,
    FeedbackContext,
    Group,
    Rollout,
    RolloutRequest,
    SourcePool,
    StepRollouts,
)

CLUSTERS = ("algebra", "geometry", "logic", "number")


def make_pool(per_cluster: int = 12, clusters: Sequence[str] = CLUSTERS) -> SourcePool:
    examples = []
    for cluster in clusters:
        for j in range(per_cluster):
            examples.append(
                Example(id=f"{cluster}-{j}", prompt=f"{cluster} question {j}", answer=str(j), domain=cluster)
            )
    return SourcePool(tuple(examples), tuple(e.domain for e in examples))


def rollouts_for(index: int, rewards: Sequence[float], start: int = 0) -> list[Rollout]:
    return [
        Rollout(
            text=f"p{index}-r{start + j}",
            reward=float(r),
            prompt_ids=(index,),
            completion_ids=(start + j, int(r)),
        )
        for j, r in enumerate(rewards)
    ]


class FakeOracle:
    """Bernoulli rewards with a hidden success rate per prompt (a third hard, a third easy, rest mixed)."""

    def __init__(self, pool: SourcePool, seed: int = 0, rates: np.ndarray | None = None):
        self.pool = pool
        rng = np.random.default_rng(seed)
        if rates is None:
            kind = rng.integers(0, 3, size=len(pool))
            rates = np.where(
                kind == 0, 0.0, np.where(kind == 1, 1.0, rng.uniform(0.25, 0.75, size=len(pool)))
            )
        self.rates = np.asarray(rates, dtype=np.float64)
        self.rng = np.random.default_rng(seed + 1)

    def __call__(self, requests: Sequence[RolloutRequest], step: int) -> list[Group]:
        groups = []
        for req in requests:
            rewards = (self.rng.random(req.num_rollouts) < self.rates[req.index]).astype(float)
            groups.append(Group(req.index, self.pool.clusters[req.index], rollouts_for(req.index, rewards)))
        return groups


@dataclass
class FakeFeedback:
    """A target owner whose accuracy rises by `lr * sum_c frac_c * values[c]` after one update.

    frac_c is the share of the candidate's loss weight on cluster c. Every value in one
    query shares a subsample noise term (paired evaluation) plus independent DP noise.
    """

    cluster_of: Callable[[Group], str]
    values: dict[str, float]
    lr: float = 1.0
    dp_noise: float = 0.0
    subsample_noise: float = 0.0
    base_accuracy: float = 0.5
    seed: int = 0
    query_every: int = 1
    fail: bool = False
    with_base: bool = True
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def should_query(self, step: int) -> bool:
        return step % self.query_every == 0

    def candidates(self, batch: Sequence[Group], weights: Sequence[Sequence[float]]) -> list[Any]:
        handles = []
        for w in weights:
            assert len(w) == len(batch)
            total = float(sum(w))
            gain = sum(wi * self.values.get(self.cluster_of(g), 0.0) for wi, g in zip(w, batch)) / total
            handles.append(self.lr * gain)
        self.calls.append({"weights": [list(w) for w in weights]})
        return handles

    def evaluate(self, candidates: Sequence[Any]) -> list[float] | None:
        if self.fail:
            return None
        common = self.rng.normal(0, self.subsample_noise) if self.subsample_noise else 0.0
        means = [self.base_accuracy] + [self.base_accuracy + float(c) for c in candidates]
        released = [m + common + (self.rng.normal(0, self.dp_noise) if self.dp_noise else 0.0) for m in means]
        return released if self.with_base else released[1:]


@dataclass
class StepRecord:
    requests: list[list[RolloutRequest]]
    so_far: StepRollouts
    batch: list[Group]


def run_step(
    policy: DataPolicy,
    step: int,
    rollout: Callable[[Sequence[RolloutRequest], int], list[Group]],
    feedback: FeedbackContext | None = None,
    max_rounds: int = 50,
) -> StepRecord:
    """Drive one step through the seam exactly as trainer_node/policies/base.py describes."""
    so_far = StepRollouts()
    rounds: list[list[RolloutRequest]] = []
    while requests := policy.next_requests(step, so_far):
        rounds.append(list(requests))
        assert len(rounds) <= max_rounds, f"{policy.name} did not end generation within {max_rounds} rounds"
        so_far.add(rollout(requests, step))
    batch = policy.training_groups(step, so_far)
    policy.observe(step, so_far.groups)
    policy.before_update(step, batch, feedback)
    return StepRecord(rounds, so_far, batch)


# --- the fakes' own checks ---------------------------------------------------------------


def test_fake_oracle_rates_drive_rewards():
    pool = make_pool(per_cluster=3)
    rates = np.array([0.0, 1.0, 0.5] * 4)
    oracle = FakeOracle(pool, rates=rates)
    groups = oracle([RolloutRequest(0, 8), RolloutRequest(1, 8), RolloutRequest(2, 400)], step=0)
    assert groups[0].rewards.tolist() == [0.0] * 8
    assert groups[1].rewards.tolist() == [1.0] * 8
    assert 0.4 < groups[2].mean_reward < 0.6


def test_fake_feedback_scores_weighted_cluster_mix():
    pool = make_pool(per_cluster=2)
    batch = [
        Group(i, pool.clusters[i], rollouts_for(i, [0, 1])) for i in (0, 2, 4)
    ]  # algebra, geometry, logic
    feedback = FakeFeedback(lambda g: g.cluster, {"geometry": 0.3}, lr=0.1)
    handles = feedback.candidates(batch, [[0, 1, 0], [1, 1, 1]])
    assert feedback.evaluate(handles) == [0.5, 0.5 + 0.03, 0.5 + 0.01]
