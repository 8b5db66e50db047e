"""L2RR: waste counter, predicted waste, allocation, q updates, learning from feedback, ablations."""

from __future__ import annotations

import copy
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from tests.trainer_node.test_policy_fakes import (
    CLUSTERS,
    FakeFeedback,
    FakeOracle,
    make_pool,
    rollouts_for,
    run_step,
)
from trainer_node.policies.base import Group, StepRollouts, build_policy
from trainer_node.policies.l2rr_estimators import (
    ESTIMATORS,
    EstimatorSettings,
    HypergradientEstimate,
    HypergradientEstimator,
    SpsaEstimator,
    build_estimator,
    estimator_names,
)
from trainer_node.policies.l2rr_rules import (
    PromptHistory,
    allocate_rollouts,
    mixed_distribution,
    predicted_waste,
)


def l2rr(pool, batch_size=8, n=8, seed=0, **options):
    # These tests are about L2RR's rules: a fake owner's release lands the step it arrives, unless a
    # test asks for the default fixed timing (test_fixed_staleness_is_the_default).
    options.setdefault("fixed_staleness", False)
    return build_policy(
        {"name": "l2rr", "batch_size": batch_size, "rollouts_per_prompt": n, **options}, pool, np.random.default_rng(seed)
    )


def feedback(values, seed=0, **kwargs):
    return FakeFeedback(lambda g: g.cluster, values, seed=seed, **kwargs)


# --- source-side rules ---------------------------------------------------------------------


def test_waste_counter_counts_streak_resets_on_informative_and_caps():
    history = PromptHistory.empty(3)
    for _ in range(2):
        history.record(0, 0.0, 8, zero_variance=True, max_waste=3)
    assert history.waste[0] == 2 and history.times_sampled[0] == 2
    history.record(0, 0.5, 8, zero_variance=False, max_waste=3)
    assert history.waste[0] == 0 and history.last_mean[0] == 0.5
    for _ in range(5):
        history.record(1, 1.0, 4, zero_variance=True, max_waste=3)
    assert history.waste[1] == 3 and history.last_count[1] == 4


def test_policy_observe_updates_history_and_cluster_waste_metric():
    pool = make_pool(per_cluster=3)  # algebra 0-2, geometry 3-5, ...
    policy = l2rr(pool)
    policy.observe(
        0, [Group(0, "algebra", rollouts_for(0, [0, 0])), Group(1, "algebra", rollouts_for(1, [0, 1]))]
    )
    policy.observe(1, [Group(0, "algebra", rollouts_for(0, [1, 1]))])
    assert policy.history.waste[:2].tolist() == [2, 0]
    metrics = policy.metrics()
    assert metrics["waste/algebra"] == 1.0  # mean over the 2 algebra prompts with history
    assert metrics["waste/geometry"] == 0.0


def test_evidence_and_predicted_waste_by_hand():
    history = PromptHistory.empty(4)
    history.record(1, 0.0, 8, True, 18)  # all wrong once
    history.record(2, 0.0, 8, True, 18)
    history.record(2, 0.0, 8, True, 18)  # all wrong twice
    history.record(3, 0.5, 8, False, 18)  # 4 of 8
    s, f = history.evidence(np.arange(4))
    assert s.tolist() == [0, 0, 0, 4] and f.tolist() == [0, 8, 16, 4]
    waste = predicted_waste(s, f, 8)
    assert waste[0] == pytest.approx(2 / 9)  # Beta(1,1): P(all 8 same) = 2 / (n + 1)
    all_wrong_once = Fraction(9, 17) + Fraction(math.factorial(8) * math.factorial(9), math.factorial(17))
    assert waste[1] == pytest.approx(float(all_wrong_once))
    assert waste[2] > waste[1] > waste[0] > waste[3]


@pytest.mark.parametrize(("p", "expected"), [(0.5, 8), (0.1, 3), (1 / 26, 2), (0.8, 6), (0.0, 2), (1.0, 2)])
def test_rollout_allocation_by_bernoulli_variance(p, expected):
    # ceil(8 * 4p(1-p)) clipped to [2, 8]: 0.1 -> ceil(2.88) = 3; 0.8 -> ceil(5.12) = 6
    assert allocate_rollouts(np.array([p]), 8, 2).tolist() == [expected]


def test_oversample_keeps_lowest_predicted_waste_and_allocates():
    pool = make_pool(per_cluster=10)
    policy = l2rr(pool, batch_size=8, n=8)
    for i in range(0, 40, 2):  # half the pool: all-wrong three times in a row
        for _ in range(3):
            policy.history.record(i, 0.0, 8, True, 18)
    twin = copy.deepcopy(policy)  # same rng state: draws the same candidates
    fresh_candidates = sum(int(i) % 2 == 1 for i in twin.draw_candidates(12))
    requests = policy.next_requests(0, StepRollouts())
    assert policy.metrics()["candidates"] == 12.0  # ceil(1.5 * 8)
    assert len(requests) == 8
    fresh = [r for r in requests if r.index % 2 == 1]
    assert len(fresh) == min(8, fresh_candidates), "a wasteful prompt is kept only when fresh ones ran out"
    assert fresh_candidates < 12, "the scenario must make the selection drop something"
    assert all(r.num_rollouts == 8 for r in fresh)  # unseen prompt: p = 1/2 -> n
    assert all(r.num_rollouts == 2 for r in requests if r.index % 2 == 0)  # p = 1/26 -> 2


def test_selection_prefers_fresh_prompts_over_wasteful_candidates():
    pool = make_pool(per_cluster=10)
    policy = l2rr(pool, batch_size=4, n=8, oversample=2.0, waste_penalty=False)  # draw ignores waste
    wasteful = set(range(0, 40, 2))
    for i in wasteful:
        policy.history.record(i, 1.0, 8, True, 18)
    for step in range(20):
        candidates = policy.draw_candidates(8)
        s, f = policy.history.evidence(candidates)
        risk = predicted_waste(s, f, 8)
        expected = set(candidates[np.argsort(risk, kind="stable")[:4]].tolist())
        # the rule, stated directly: nothing dropped has lower predicted waste than anything kept
        assert max(risk[[c in expected for c in candidates]]) <= min(
            list(risk[[c not in expected for c in candidates]]) + [1.0]
        )


def test_draw_respects_waste_weights_within_cluster():
    pool = make_pool(per_cluster=10, clusters=("only",))
    on = l2rr(pool, batch_size=1, lambda_waste=1.0, max_waste=10)
    off = l2rr(pool, batch_size=1, lambda_waste=1.0, max_waste=10, waste_penalty=False)
    for policy in (on, off):
        for i in range(5):
            for _ in range(10):
                policy.history.record(i, 0.0, 8, True, 10)  # waste 10: weight exp(-10) relative to 1
    hits_on = sum(int(on.draw_candidates(1)[0]) < 5 for _ in range(400))
    hits_off = sum(int(off.draw_candidates(1)[0]) < 5 for _ in range(400))
    assert hits_on <= 2
    assert 150 < hits_off < 250


def _gumbel_reference(waste: np.ndarray, take: int, lam: float, rng: np.random.Generator) -> np.ndarray:
    """The slow reference: Gumbel top-k over every prompt (successive sampling, O(cluster))."""
    keys = -lam * waste + rng.gumbel(size=len(waste))
    return np.argsort(-keys, kind="stable")[:take]


def test_bucket_draw_keeps_the_distribution_of_the_gumbel_reference():
    # One cluster of 12 prompts at waste levels 0..5: inclusion frequencies and first-pick
    # frequencies of the O(batch) bucket draw against the O(pool) Gumbel top-k, 20,000 draws each.
    waste = np.array([0, 0, 1, 1, 1, 2, 3, 3, 4, 5, 5, 5])
    lam, take, draws = 0.7, 4, 20_000
    history = PromptHistory.empty(len(waste))
    for i, w in enumerate(waste.tolist()):
        for _ in range(w):
            history.record(i, 0.0, 4, True, 18)
    history.indexed(np.zeros(len(waste), dtype=np.int64), 1, 18)
    fast_rng, slow_rng = np.random.default_rng(1), np.random.default_rng(2)
    fast_in, slow_in = np.zeros(len(waste)), np.zeros(len(waste))
    fast_first, slow_first = np.zeros(len(waste)), np.zeros(len(waste))
    for _ in range(draws):
        fast = history.index.draw(0, take, lam, fast_rng)
        slow = _gumbel_reference(waste, take, lam, slow_rng)
        assert len(set(fast.tolist())) == take
        fast_in[fast] += 1
        slow_in[slow] += 1
        fast_first[fast[0]] += 1
        slow_first[slow[0]] += 1
    for fast_counts, slow_counts in ((fast_in, slow_in), (fast_first, slow_first)):
        p = (fast_counts + slow_counts) / (2 * draws)
        sd = np.sqrt(2 * p * (1 - p) / draws)  # of the difference of two frequencies
        assert np.all(np.abs(fast_counts - slow_counts) / draws <= 5 * sd + 1e-12)
    expected_first = np.exp(-lam * waste) / np.exp(-lam * waste).sum()
    assert fast_first / draws == pytest.approx(expected_first, abs=0.012)


def test_waste_index_follows_every_update():
    # Random groups over 3 clusters: the buckets hold exactly the prompts at each level, pos is the
    # inverse of order, and the running cluster waste equals the pass over the pool.
    rng = np.random.default_rng(0)
    cluster_of = rng.integers(0, 3, size=60)
    members = [np.flatnonzero(cluster_of == c) for c in range(3)]
    history = PromptHistory.empty(60).indexed(cluster_of, 3, max_waste=4)
    bare = PromptHistory.empty(60)
    for _ in range(200):
        indices = rng.choice(60, size=8, replace=False)
        zero = rng.random(8) < 0.7
        means, counts = rng.random(8), rng.integers(2, 9, size=8)
        history.record_groups(indices, means, counts, zero, 4)
        for i, m, c, z in zip(indices.tolist(), means, counts, zero):
            bare.record(i, float(m), int(c), bool(z), 4)
        index = history.index
        assert (index.pos[index.order] == np.arange(60)).all()
        for c in range(3):
            for level in range(index.levels):
                b = c * index.levels + level
                inside = set(index.order[index.bounds[b] : index.bounds[b + 1]].tolist())
                assert inside == set(np.flatnonzero((cluster_of == c) & (history.waste == level)).tolist())
    assert history.waste.tolist() == bare.waste.tolist()
    assert history.cluster_waste(members) == pytest.approx(bare.cluster_waste(members))


def test_rollout_allocation_switch_off_gives_every_prompt_n():
    pool = make_pool(per_cluster=10)
    policy = l2rr(pool, batch_size=8, n=8, rollout_allocation=False)
    for i in range(40):
        policy.history.record(i, 0.0, 8, True, 18)
    assert {r.num_rollouts for r in policy.next_requests(0, StepRollouts())} == {8}


def test_training_batch_drops_zero_variance_groups():
    pool = make_pool(per_cluster=10)
    policy = l2rr(pool, batch_size=8, n=4)
    record = run_step(policy, 0, FakeOracle(pool, seed=1))
    assert [g.index for g in record.batch] == [g.index for g in record.so_far.groups if not g.zero_variance]
    assert policy.metrics()["rollouts_requested"] <= 8 * 4


# --- q learning ------------------------------------------------------------------------------


def test_q_update_on_hand_computed_hypergradient():
    pool = make_pool(per_cluster=2, clusters=("a", "b", "c"))
    policy = l2rr(pool, eta_q=0.1, q_floor=0.05)
    grad = np.array([0.05, 0.02, -0.01])  # centred: [0.03, 0, -0.03], mean square 0.0006
    policy.apply_hypergradient(HypergradientEstimate(grad, np.array([True, True, True])))
    scale = math.sqrt(0.0006)  # first EMA update, bias-corrected: exactly the RMS
    expected_logits = 0.1 * np.array([0.03, 0.0, -0.03]) / scale
    assert policy.logits == pytest.approx(expected_logits)
    z = np.exp(expected_logits)
    assert policy.q() == pytest.approx(0.95 * z / z.sum() + 0.05 / 3)
    metrics = policy.metrics()
    assert metrics["hypergrad/a"] == 0.05 and metrics["q/a"] == pytest.approx(policy.q()[0])


def test_q_update_unobserved_cluster_and_waste_penalty():
    pool = make_pool(per_cluster=2, clusters=("a", "b", "c"))
    policy = l2rr(pool, eta_q=0.5, lambda_waste=0.25)
    policy.history.record(0, 0.0, 8, True, 18)
    policy.history.record(0, 0.0, 8, True, 18)  # cluster a: waste 2 on its one seen prompt
    grad = np.array([0.0, 0.02, 0.04])
    policy.apply_hypergradient(HypergradientEstimate(grad, np.array([False, True, True]), gain=0.5))
    normalised = np.array([0.0, -1.0, 1.0])  # centred over b, c: [-0.01, 0.01] / RMS 0.01
    penalty = 0.25 * (np.array([2.0, 0, 0]) - 2 / 3)
    expected = 0.5 * 0.5 * (normalised - penalty)
    assert policy.logits == pytest.approx(expected - expected.mean())

    off = l2rr(pool, eta_q=0.5, lambda_waste=0.25, waste_penalty=False)
    off.history = copy.deepcopy(policy.history)
    off.apply_hypergradient(HypergradientEstimate(grad, np.array([False, True, True]), gain=0.5))
    assert off.logits == pytest.approx(0.25 * normalised - (0.25 * normalised).mean())


def test_mixed_distribution_floor():
    q = mixed_distribution(np.array([100.0, 0.0, 0.0, 0.0]), 0.05)
    assert q.sum() == pytest.approx(1.0) and q.min() == pytest.approx(0.05 / 4)


def test_pool_prior_starts_q_at_each_clusters_share_of_the_pool():
    """q_prior = pool: q starts where uniform sampling over prompts is (before the floor mixes in)."""
    from trainer_node.policies.base import SourcePool

    sizes = {"a": 4, "b": 12, "c": 24}  # unequal clusters of one pool
    examples = tuple(e for cluster, count in sizes.items() for e in make_pool(per_cluster=count, clusters=[cluster]).examples)
    pool = SourcePool(examples, tuple(e.domain for e in examples))
    shares = np.array([sizes[c] for c in pool.cluster_names], dtype=float) / sum(sizes.values())
    floor = 0.05
    assert l2rr(pool, q_prior="pool", q_floor=floor).q() == pytest.approx((1 - floor) * shares + floor / 3)
    assert l2rr(pool, q_floor=floor).q() == pytest.approx(np.full(3, 1 / 3))  # the default: the paper's uniform q
    with pytest.raises(ValueError, match="q_prior"):
        l2rr(pool, q_prior="sizes")


@pytest.mark.parametrize("estimator", ["lookahead", "spsa"])
def test_learns_to_upweight_the_cluster_the_target_rewards(estimator):
    pool = make_pool(per_cluster=20)
    oracle = FakeOracle(pool, seed=2, rates=np.full(len(pool), 0.5))
    policy = l2rr(pool, batch_size=8, n=4, seed=3, estimator=estimator)
    owner = feedback({"logic": 1.0}, seed=4, lr=0.02, dp_noise=0.002, subsample_noise=0.01)
    for step in range(30):
        run_step(policy, step, oracle, owner)
    q = policy.q()
    logic = CLUSTERS.index("logic")
    assert q[logic] > 0.25 and q[logic] == q.max()
    # A batch from one cluster spends no query; q concentrated on logic makes some of those.
    assert policy.metrics()["feedback_queries"] >= 20.0


def test_lookahead_builds_one_candidate_per_cluster_present():
    pool = make_pool(per_cluster=2)
    batch = [
        Group(i, pool.clusters[i], rollouts_for(i, [0, 1])) for i in (0, 1, 4, 6)
    ]  # algebra x2, logic, number
    clusters = np.array([0, 0, 2, 3])
    owner = feedback({"algebra": 0.1, "logic": -0.2})
    estimate = build_estimator("lookahead", EstimatorSettings()).estimate(
        batch, clusters, np.full(4, 0.25), owner, np.random.default_rng(0)
    )
    assert owner.calls[0]["weights"] == [[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert estimate.grad == pytest.approx([0.1, 0.0, -0.2, 0.0])
    assert estimate.observed.tolist() == [True, False, True, True]

    limited = build_estimator("lookahead", EstimatorSettings(lookahead_max_clusters=2))
    limited.estimate(batch, clusters, np.full(4, 0.25), owner, np.random.default_rng(0))
    assert len(owner.calls[1]["weights"]) == 2


def test_lookahead_without_the_base_steps_q_exactly_as_with_it():
    """The base's accuracy is shared by every difference and L2RR centres the estimate, so a
    release of the candidates alone moves the logits exactly as the release with the base."""
    from trainer_node.policies.l2rr_estimators import LookaheadEstimator

    assert LookaheadEstimator.needs_base is False and SpsaEstimator.needs_base is False
    pool = make_pool(per_cluster=2)
    batch = [Group(i, pool.clusters[i], rollouts_for(i, [0, 1])) for i in (0, 1, 4, 6)]
    clusters = np.array([0, 0, 2, 3])
    plan = build_estimator("lookahead", EstimatorSettings()).plan(batch, clusters, np.full(4, 0.25),
                                                                   np.random.default_rng(0))
    with_base, without = plan.conclude([0.5, 0.6, 0.3, 0.55]), plan.conclude([0.6, 0.3, 0.55])
    assert without.grad[without.observed].sum() == pytest.approx(0.0)
    policies = [l2rr(pool) for _ in range(2)]
    for policy, estimate in zip(policies, (with_base, without)):
        policy.apply_hypergradient(estimate)
    assert policies[0].logits == pytest.approx(policies[1].logits, abs=1e-12)
    with pytest.raises(ValueError, match="3 candidates"):
        plan.conclude([0.5, 0.6])


class _BaseFreeFeedback:
    """A context that can leave the base out: records what each query asked for."""

    releases_without_base = True

    def __init__(self, inner):
        self.inner, self.asked = inner, []

    def should_query(self, step):
        return self.inner.should_query(step)

    def candidates(self, batch, weights):
        return self.inner.candidates(batch, weights)

    def evaluate(self, candidates, with_base=True):
        self.asked.append(with_base)
        released = self.inner.evaluate(candidates)
        return released if with_base or released is None else released[1:]


@pytest.mark.parametrize(("estimator", "release_base", "asked"), [
    ("lookahead", False, False), ("lookahead", True, True), ("spsa", False, False)])
def test_l2rr_leaves_the_base_out_where_its_estimator_allows(estimator, release_base, asked):
    pool = make_pool(per_cluster=10)
    policy = l2rr(pool, batch_size=8, n=4, estimator=estimator, release_base=release_base, max_staleness=0)
    owner = _BaseFreeFeedback(feedback({"logic": 1.0}))
    run_step(policy, 0, FakeOracle(pool, seed=1, rates=np.full(40, 0.5)), owner)
    assert owner.asked == [asked] and policy.feedback_queries == 1


def test_spsa_estimate_paired_perturbation_by_hand():
    pool = make_pool(per_cluster=2)
    batch = [Group(i, pool.clusters[i], rollouts_for(i, [0, 1])) for i in (0, 2, 4, 6)]  # one per cluster
    clusters = np.arange(4)
    q = np.array([0.4, 0.3, 0.2, 0.1])
    owner = feedback({"geometry": 1.0}, lr=1.0)
    spsa = SpsaEstimator(EstimatorSettings(spsa_a=2.0, spsa_A=10.0, spsa_c=0.5))
    rng = np.random.default_rng(7)
    delta = np.random.default_rng(7).choice(np.array([-1.0, 1.0]), size=4)
    estimate = spsa.estimate(batch, clusters, q, owner, rng)

    plus, minus = q * np.exp(0.5 * delta), q * np.exp(-0.5 * delta)  # batch share is 1/4 each
    w_plus, w_minus = owner.calls[0]["weights"]
    assert np.array(w_plus) == pytest.approx(plus / plus.mean())
    assert np.array(w_minus) == pytest.approx(minus / minus.mean())
    y_diff = plus[1] / plus.sum() - minus[1] / minus.sum()
    assert estimate.grad == pytest.approx(y_diff / 1.0 * delta)
    assert estimate.gain == pytest.approx(2.0) and spsa.iterations == 1
    a1, c1 = spsa.gains()
    assert a1 == pytest.approx(2.0 * (11 / 12) ** 0.602) and c1 == pytest.approx(0.5 / 2**0.101)


def test_spsa_accepts_release_without_base():
    pool = make_pool(per_cluster=2)
    batch = [Group(i, pool.clusters[i], rollouts_for(i, [0, 1])) for i in (0, 2)]
    owner = feedback({"algebra": 1.0}, with_base=False)
    estimate = build_estimator("spsa", EstimatorSettings()).estimate(
        batch, np.array([0, 1]), np.full(4, 0.25), owner, np.random.default_rng(0)
    )
    assert estimate is not None and estimate.observed.tolist() == [True, True, False, False]


def test_failed_query_keeps_q_and_counts():
    pool = make_pool(per_cluster=10)
    policy = l2rr(pool, batch_size=8, n=4)
    owner = feedback({"logic": 1.0}, fail=True)
    run_step(policy, 0, FakeOracle(pool, seed=1, rates=np.full(40, 0.5)), owner)
    assert policy.logits.tolist() == [0.0] * 4
    assert policy.metrics()["feedback_failures"] == 1.0 and policy.metrics()["feedback_queries"] == 0.0


def test_no_query_when_not_allowed_or_single_cluster():
    pool = make_pool(per_cluster=10)
    oracle = FakeOracle(pool, seed=1, rates=np.full(40, 0.5))
    paced = feedback({"logic": 1.0}, query_every=3)
    policy = l2rr(pool, batch_size=8, n=4)
    for step in range(6):
        run_step(policy, step, oracle, paced)
    assert len(paced.calls) == 2  # steps 0 and 3

    single = feedback({"logic": 1.0})
    policy.before_update(6, [Group(i, "algebra", rollouts_for(i, [0, 1])) for i in range(3)], single)
    assert single.calls == []


def test_uniform_q_ablation_never_queries():
    pool = make_pool(per_cluster=10)
    owner = feedback({"logic": 1.0})
    policy = l2rr(pool, batch_size=8, n=4, learn_q=False)
    for step in range(5):
        run_step(policy, step, FakeOracle(pool, seed=step), owner)
    assert owner.calls == [] and policy.q() == pytest.approx(np.full(4, 0.25))


def test_unknown_estimator_lists_known():
    with pytest.raises(ValueError, match="lookahead"):
        l2rr(make_pool(), estimator="bogus")
    with pytest.raises(ValueError, match="unknown hypergradient estimator 'bogus'; known: lookahead, release_difference, spsa"):
        build_estimator("bogus", EstimatorSettings())


def test_estimator_registry_refuses_duplicates_and_foreign_classes():
    with pytest.raises(ValueError, match="hypergradient estimator 'spsa' is already registered"):
        ESTIMATORS.register("spsa")(type("Again", (SpsaEstimator,), {}))
    with pytest.raises(TypeError, match="not a subclass of HypergradientEstimator"):
        ESTIMATORS.copy().register("dict")(dict)
    assert ESTIMATORS.entry_point_group == "target_feedback.hypergradient_estimators"


@pytest.mark.parametrize("name", estimator_names())
def test_every_estimator_spends_one_query_and_round_trips_its_state(name):
    # The contract L2RR relies on for any entry: same settings in, one feedback call per estimate,
    # (C,) gradient and observed mask, None when nothing was released, a JSON state that resumes.
    pool = make_pool(per_cluster=2)
    batch = [Group(i, pool.clusters[i], rollouts_for(i, [0, 1])) for i in (0, 2, 4)]
    clusters, q = np.array([0, 1, 2]), np.full(4, 0.25)
    estimator = build_estimator(name, EstimatorSettings())
    assert isinstance(estimator, HypergradientEstimator) and estimator.name == name
    owner = feedback({"geometry": 1.0})
    estimate = estimator.estimate(batch, clusters, q, owner, np.random.default_rng(0))
    assert len(owner.calls) == 1
    assert estimate.grad.shape == (4,) and estimate.observed.shape == (4,) and not estimate.observed[3]
    assert estimator.estimate(batch, clusters, q, feedback({}, fail=True), np.random.default_rng(0)) is None
    resumed = build_estimator(name, EstimatorSettings())
    resumed.load_state_dict(json.loads(json.dumps(estimator.state_dict())))
    assert resumed.state_dict() == estimator.state_dict()


def test_bad_checkpoint_changes_nothing():
    pool = make_pool(per_cluster=10)
    policy = l2rr(pool)
    state = json.loads(json.dumps(policy.state_dict()))
    state["logits"] = [1.0, 2.0]
    before = json.dumps(policy.state_dict())
    with pytest.raises(ValueError, match="logits"):
        policy.load_state_dict(state)
    assert json.dumps(policy.state_dict()) == before


@pytest.mark.parametrize("estimator", ["lookahead", "spsa"])
def test_resume_reproduces_requests_and_q_with_feedback(estimator):
    pool = make_pool(per_cluster=10)
    oracle = FakeOracle(pool, seed=6)
    owner = feedback({"geometry": 1.0}, lr=0.02, dp_noise=0.003, seed=2)
    policy = l2rr(pool, batch_size=8, n=4, seed=5, estimator=estimator)
    for step in range(5):
        run_step(policy, step, oracle, owner)
    resumed = l2rr(pool, batch_size=8, n=4, seed=123, estimator=estimator)
    resumed.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    resumed.rng.bit_generator.state = copy.deepcopy(policy.rng.bit_generator.state)
    oracle_twin, owner_twin = copy.deepcopy(oracle), copy.deepcopy(owner)
    for step in range(5, 9):
        assert (
            run_step(policy, step, oracle, owner).requests
            == run_step(resumed, step, oracle_twin, owner_twin).requests
        )
    assert resumed.q().tolist() == policy.q().tolist()


# --- asynchronous feedback ---------------------------------------------------------------------


class DelayedFeedback:
    """FakeFeedback answering `delay` steps after a query (a background owner), counted by the
    policy's own calls to should_query, which come once per step."""

    def __init__(self, inner, delay: int):
        self.inner, self.delay = inner, delay
        self.now = 0
        self.submitted: list[int] = []
        self.waited: list[int] = []

    def should_query(self, step):
        self.now = step
        return self.inner.should_query(step)

    def candidates(self, batch, weights):
        return self.inner.candidates(batch, weights)

    def evaluate(self, candidates):
        return self.inner.evaluate(candidates)

    def submit_lookahead(self, batch, weights):
        released = self.inner.evaluate(self.inner.candidates(batch, weights))
        asked, outer = self.now, self

        class Pending:
            def ready(self):
                return outer.now - asked >= outer.delay

            def result(self):
                if not self.ready():
                    outer.waited.append(outer.now)
                return released

        self.submitted.append(asked)
        return Pending()


def _run_async(max_staleness, delay, steps=12, fail=False, **options):
    pool = make_pool(per_cluster=10)
    oracle = FakeOracle(pool, seed=1, rates=np.full(40, 0.5))
    policy = l2rr(pool, batch_size=8, n=4, max_staleness=max_staleness, **options)
    owner = DelayedFeedback(feedback({"logic": 1.0}, seed=3, fail=fail), delay)
    history = []
    for step in range(steps):
        owner.now = step
        run_step(policy, step, oracle, owner)
        history.append((policy.metrics()["feedback_queries"], policy.metrics()["feedback_staleness"]))
    return policy, owner, history


def test_async_release_is_applied_when_it_arrives_and_one_query_is_in_flight():
    policy, owner, history = _run_async(max_staleness=5, delay=2)
    assert owner.waited == []  # it arrived within the bound: training never waited
    assert all(b - a >= 2 for a, b in zip(owner.submitted, owner.submitted[1:]))  # one in flight
    assert {staleness for _, staleness in history if staleness} == {2.0}
    assert policy.q().max() > 0.25 + 1e-9  # the releases did move q


def test_async_staleness_is_bounded_by_waiting_at_the_bound():
    _, owner, history = _run_async(max_staleness=1, delay=3)
    assert owner.waited  # the release was late: the step at the bound waited for it
    assert max(staleness for _, staleness in history) == 1.0
    assert history[-1][0] >= 3  # and the releases were applied


def test_synchronous_mode_equals_the_plain_evaluate_path():
    # max_staleness = 0 through a submitting context makes the same draws and the same q as a
    # context without submit (the synchronous path the tests above use).
    sync_policy, _, _ = _run_async(max_staleness=0, delay=0)
    pool = make_pool(per_cluster=10)
    oracle = FakeOracle(pool, seed=1, rates=np.full(40, 0.5))
    plain = l2rr(pool, batch_size=8, n=4, max_staleness=0)
    owner = feedback({"logic": 1.0}, seed=3)
    for step in range(12):
        run_step(plain, step, oracle, owner)
    assert plain.q().tolist() == sync_policy.q().tolist()


def test_a_failed_async_query_counts_and_keeps_q():
    policy, _, _ = _run_async(max_staleness=3, delay=1, fail=True)
    assert policy.logits.tolist() == [0.0] * 4
    assert policy.metrics()["feedback_failures"] >= 1 and policy.metrics()["feedback_queries"] == 0


def test_fixed_staleness_is_the_default():
    """Issue 42: one seed gives one run whatever the owner's speed, unless a deployment opts out."""
    from trainer_node.policies.l2rr import L2rrOptions

    defaults = L2rrOptions()
    assert defaults.fixed_staleness and defaults.max_staleness == 8
    default_fast, _, _ = _run_async(max_staleness=3, delay=1, fixed_staleness=L2rrOptions().fixed_staleness)
    default_slow, _, _ = _run_async(max_staleness=3, delay=3, fixed_staleness=L2rrOptions().fixed_staleness)
    assert default_fast.q().tolist() == default_slow.q().tolist()


def test_fixed_staleness_makes_the_run_independent_of_the_owners_speed():
    """fixed_staleness: a release lands exactly max_staleness steps after its query, so an owner
    that answers in 1 step and one that answers in 3 give the same run; without it they do not."""
    fast, _, fast_history = _run_async(max_staleness=3, delay=1, fixed_staleness=True)
    slow, slow_owner, slow_history = _run_async(max_staleness=3, delay=3, fixed_staleness=True)
    assert fast.q().tolist() == slow.q().tolist() and fast_history == slow_history
    assert {staleness for _, staleness in fast_history if staleness} == {3.0}
    assert slow_owner.waited == []  # on time at the bound: nobody waited
    free_fast, _, _ = _run_async(max_staleness=3, delay=1)
    free_slow, _, _ = _run_async(max_staleness=3, delay=3)
    assert free_fast.q().tolist() != free_slow.q().tolist()
