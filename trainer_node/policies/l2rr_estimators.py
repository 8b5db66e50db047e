"""Hypergradient estimators for L2RR's outer problem (docs/L2RR.md has the derivations).

The outer variable is the cluster distribution q. Each estimator spends ONE feedback query
(one multi-candidate release on one secret subsample) and returns an ascent direction for
the target accuracy of the model one update after training on the current batch:

- "lookahead": one candidate per cluster c in the batch, trained on c's groups only;
  g_c = acc(theta_c) - acc(theta). Estimates dAcc/dq_c (mirror-ascent coordinates).
- "spsa": two candidates whose batch is importance-reweighted to the cluster mixes
  q * exp(+-c_k * Delta); g = (y+ - y-) / (2 c_k) * Delta. Estimates dAcc/d(log q).
- "release_difference": no candidates at all. Each query is one release of the CURRENT model;
  the change in released accuracy since the previous release is regressed (ridge, decayed
  sufficient statistics) on the cluster mix actually trained in between, less q's share, after
  a baseline (the EMA of the change per step) is taken off. Estimates dAcc/dq_c up to a constant.

What an estimator needs is a capability, `needs_candidates`: lookahead and spsa need lookahead
candidates (extra training passes that only this project's own loop offers); release_difference
needs only releases of the current checkpoint, so it also runs inside engines that own their
training step (TRL, verl: trainer_node/integrations/). An engine declares what it offers and
L2RR's config check refuses an estimator it cannot serve (trainer_node/integrations/support.py).

Each estimator says what to ask (`plan`: one group-weight vector per candidate) and how to
read the answer (the plan's `conclude`: the release -> an estimate), so the query can be
answered later than it was asked (asynchronous feedback: L2RR's max_staleness); `estimate`
asks and reads at once. To add one:
    @ESTIMATORS.register("mine")
    class Mine(HypergradientEstimator): def plan(self, batch, batch_clusters, q, rng) -> QueryPlan: ...
and select it with the l2rr option `estimator = "mine"` (a plug-in: entry point
`target_feedback.hypergradient_estimators`). Every estimator takes the same EstimatorSettings, so
L2RR builds any of them the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from protocol.plugins import Registry, subclass_entries
from trainer_node.policies.base import FeedbackContext, Group


@dataclass(frozen=True)
class EstimatorSettings:
    """Constants of every estimator (each reads its own)."""

    lookahead_max_clusters: int = 0  # candidates per lookahead query; 0 = every cluster in the batch
    spsa_a: float = 1.0  # step gain at k = 0: a_k = spsa_a * ((1 + A) / (k + 1 + A)) ** 0.602
    spsa_A: float = 10.0  # stability constant A (Spall: ~10% of the expected iterations)
    spsa_c: float = 0.5  # perturbation size in log-weight space: c_k = spsa_c / (k + 1) ** 0.101
    release_decay: float = 0.8  # release_difference: weight of older (deviation, residual) pairs per query
    release_ridge: float = 0.1  # release_difference: ridge, relative to the mean squared deviation
    release_baseline_beta: float = 0.8  # release_difference: EMA of the accuracy change per step


@dataclass(frozen=True)
class HypergradientEstimate:
    grad: np.ndarray  # (C,) ascent direction; 0 where not observed
    observed: np.ndarray  # (C,) bool: clusters this query said something about
    gain: float = 1.0  # step-size multiplier for this estimate (SPSA's decaying a_k)


@dataclass(frozen=True)
class QueryPlan:
    """One query: the candidates to build, and how to turn their release into an estimate."""

    weights: list[list[float]]
    """One group-weight vector per candidate (len(batch) entries each)."""
    conclude: Callable[[Sequence[float]], HypergradientEstimate]
    """Released accuracies [base, *candidates] (or [*candidates] for an estimator that does not
    need the base) -> the estimate (raises ValueError on a wrong length). A difference release
    is read as [0, *differences]: the base's change from itself is 0."""
    mixtures: list[np.ndarray] | None = None
    """Instead of `weights`: one cluster mixture (C,) per candidate, stepped along the clusters'
    running directions (grpo.lookahead_directions = cluster_mean; `plan_directions`)."""


class HypergradientEstimator(ABC):
    name: ClassVar[str] = ""  # set by registration
    needs_candidates: ClassVar[bool] = True
    """Its queries carry lookahead candidates (extra training passes of the engine); False: only
    releases of the current model, which any engine can offer."""
    needs_base: ClassVar[bool] = True
    """Its estimate reads the live model's accuracy beside the candidates'; False: only differences
    between candidates, so a query may leave the base out (`conclude` takes either release)."""

    def __init__(self, settings: EstimatorSettings):
        self.settings = settings

    @abstractmethod
    def plan(
        self,
        batch: Sequence[Group],
        batch_clusters: np.ndarray,  # (len(batch),) cluster id of each group
        q: np.ndarray,  # (C,) current cluster distribution
        rng: np.random.Generator,
    ) -> QueryPlan:
        """The query to spend: its candidates' group weights and how to read its release."""

    def plan_directions(self, available: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> QueryPlan | None:
        """The query to spend when the trainer builds candidates along running cluster directions
        (`available`: (C,) bool, the clusters with one): candidates as cluster mixtures. None: this
        estimator has no such plan (it is then planned from the batch, `plan`)."""
        return None

    def estimate(
        self,
        batch: Sequence[Group],
        batch_clusters: np.ndarray,
        q: np.ndarray,
        feedback: FeedbackContext,
        rng: np.random.Generator,
    ) -> HypergradientEstimate | None:
        """Spend one feedback query now; None when the owner released nothing (keep the last q)."""
        plan = self.plan(batch, batch_clusters, q, rng)
        accuracies = feedback.evaluate(feedback.candidates(batch, plan.weights))
        return None if accuracies is None else plan.conclude(accuracies)

    def record_training(self, batch_clusters: np.ndarray, q: np.ndarray) -> None:
        """One training batch (cluster id per group) was trained into the model while q was `q`.

        Called for every update, after the step's query (if any) was planned: the next release
        measures a model that includes this batch. Estimators that read only their candidates ignore it."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


# The estimators are defined below, so the registry needs no lazy built-ins.
ESTIMATORS: Registry[type[HypergradientEstimator]] = Registry(
    "hypergradient_estimators",
    noun="hypergradient estimator",
    on_add=subclass_entries(HypergradientEstimator, "hypergradient estimator"),
)


def estimator_names() -> list[str]:
    return ESTIMATORS.names()


def build_estimator(name: str, settings: EstimatorSettings) -> HypergradientEstimator:
    """Create a registered estimator by name. Known names: see estimator_names()."""
    return ESTIMATORS.get(name)(settings)


def estimator_class(name: str) -> type[HypergradientEstimator]:
    """The class registered as `name`, for its capabilities (needs_candidates)."""
    return ESTIMATORS.get(name)


def candidate_free_estimators() -> list[str]:
    """Estimators that need only releases of the current model (any engine can serve them)."""
    return [name for name in estimator_names() if not ESTIMATORS.get(name).needs_candidates]


def _released(accuracies: Sequence[float], candidates: int, base_optional: bool = False) -> np.ndarray:
    """The owner's release as floats, [base, *candidates]; a wrong length is a trainer bug.

    With base_optional, a release of the candidates alone is accepted too and returned as is.
    """
    values = np.asarray(accuracies, dtype=np.float64)
    lengths = (candidates + 1, candidates) if base_optional else (candidates + 1,)
    if values.ndim != 1 or len(values) not in lengths or not np.all(np.isfinite(values)):
        raise ValueError(
            f"feedback.evaluate returned {len(values)} values for {candidates} candidates; "
            f"expected {candidates + 1} finite accuracies [base, *candidates]"
        )
    return values


@ESTIMATORS.register("lookahead")
class LookaheadEstimator(HypergradientEstimator):
    """Per-cluster one-step lookahead: a paired finite difference per cluster.

    L2RR centres the estimate over the clusters it observed, so the base's accuracy, shared by
    every difference, cancels: the base need not be scored (needs_base = False). Without it the
    estimate is the candidates' accuracies centred, the same vector L2RR steps along."""

    needs_base = False

    def plan(self, batch, batch_clusters, q, rng):
        present = np.unique(batch_clusters)
        limit = self.settings.lookahead_max_clusters
        if 0 < limit < len(present):
            present = np.sort(rng.choice(present, size=limit, replace=False))
        weights = [
            [1.0 if c == cluster else 0.0 for c in batch_clusters.tolist()] for cluster in present.tolist()
        ]

        return QueryPlan(weights, _per_cluster_conclusion(present, len(q)))

    def plan_directions(self, available, q, rng):
        present = np.flatnonzero(available)
        if len(present) < 2:
            return None
        limit = self.settings.lookahead_max_clusters
        if 0 < limit < len(present):
            present = np.sort(rng.choice(present, size=limit, replace=False))
        mixtures = [np.eye(len(q))[cluster] for cluster in present.tolist()]
        return QueryPlan([], _per_cluster_conclusion(present, len(q)), mixtures)


def _per_cluster_conclusion(present: np.ndarray, clusters: int) -> Callable[[Sequence[float]], HypergradientEstimate]:
    """g_c = acc(theta_c) - acc(theta) for each cluster of `present` (one candidate each, in order);
    without the base, the candidates' accuracies centred (the same vector L2RR steps along)."""

    def conclude(accuracies: Sequence[float]) -> HypergradientEstimate:
        values = _released(accuracies, len(present), base_optional=True)
        grad = np.zeros(clusters)
        if len(values) > len(present):
            grad[present] = values[1:] - values[0]
        else:
            grad[present] = values - values.mean()
        observed = np.zeros(clusters, dtype=bool)
        observed[present] = True
        return HypergradientEstimate(grad, observed)

    return conclude


@ESTIMATORS.register("spsa")
class SpsaEstimator(HypergradientEstimator):
    """Simultaneous-perturbation estimate from one paired (+, -) candidate query."""

    needs_base = False  # a paired difference of its two candidates

    def __init__(self, settings: EstimatorSettings):
        super().__init__(settings)
        self.iterations = 0  # k: successful queries so far

    def gains(self) -> tuple[float, float]:
        """(a_k, c_k) for the next query."""
        k, s = self.iterations, self.settings
        a_k = s.spsa_a * ((1 + s.spsa_A) / (k + 1 + s.spsa_A)) ** 0.602
        c_k = s.spsa_c / (k + 1) ** 0.101
        return a_k, c_k

    def plan(self, batch, batch_clusters, q, rng):
        a_k, c_k = self.gains()
        delta = rng.choice(np.array([-1.0, 1.0]), size=len(q))
        present = np.unique(batch_clusters)
        share = np.bincount(batch_clusters, minlength=len(q)) / len(batch_clusters)

        def group_weights(sign: float) -> list[float]:
            # Reweight the batch (cluster shares `share`) so it trains like a batch drawn from
            # the perturbed mix: weight w_c / share_c, renormalised to mean 1 over the batch.
            mix = q * np.exp(sign * c_k * delta)
            ratio = np.zeros(len(q))
            ratio[present] = mix[present] / share[present]
            per_group = ratio[batch_clusters]
            return (per_group / per_group.mean()).tolist()

        def conclude(accuracies: Sequence[float]) -> HypergradientEstimate:
            # The base model's accuracy is not needed: the estimate is the paired difference.
            y_plus, y_minus = _released(accuracies, 2, base_optional=True)[-2:]
            grad = np.zeros(len(q))
            grad[present] = (y_plus - y_minus) / (2 * c_k) * delta[present]  # Delta^-1 = Delta for +-1
            observed = np.zeros(len(q), dtype=bool)
            observed[present] = True
            self.iterations += 1
            return HypergradientEstimate(grad, observed, gain=a_k)

        return QueryPlan([group_weights(+1.0), group_weights(-1.0)], conclude)

    def plan_directions(self, available, q, rng):
        present = np.flatnonzero(available)
        if len(present) < 2:
            return None
        a_k, c_k = self.gains()
        delta = rng.choice(np.array([-1.0, 1.0]), size=len(q))

        def mixture(sign: float) -> np.ndarray:  # the perturbed mix over the clusters with a direction
            mix = np.zeros(len(q))
            mix[present] = q[present] * np.exp(sign * c_k * delta[present])
            return mix / mix.sum()

        def conclude(accuracies: Sequence[float]) -> HypergradientEstimate:
            y_plus, y_minus = _released(accuracies, 2, base_optional=True)[-2:]
            grad = np.zeros(len(q))
            grad[present] = (y_plus - y_minus) / (2 * c_k) * delta[present]
            observed = np.zeros(len(q), dtype=bool)
            observed[present] = True
            self.iterations += 1
            return HypergradientEstimate(grad, observed, gain=a_k)

        return QueryPlan([], conclude, [mixture(+1.0), mixture(-1.0)])

    def state_dict(self) -> dict[str, Any]:
        return {"iterations": self.iterations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iterations = int(state["iterations"])


@ESTIMATORS.register("release_difference")
class ReleaseDifferenceEstimator(HypergradientEstimator):
    """Change between consecutive releases of the current model, regressed on the mix trained in between.

    docs/L2RR.md ("release_difference") has the derivation. Per query k (one release, one
    checkpoint: the base) with the previous successful release k':
        D_k  = sum over the updates since k' of (share of cluster c in the trained batch - q_c)
        r_k  = (acc_k - acc_k') - n_k * b         (n_k updates; b: EMA of the change per update)
        A   <- decay * A + D_k D_k^T,   v <- decay * v + r_k D_k
        g    = (A + ridge * mean(diag A) * I)^-1 v
    g estimates dAcc/dq_c up to a constant (the deviations sum to 0, so the common part is the
    baseline's); L2RR centres it anyway. A failed query's interval is folded into the next one.
    """

    needs_candidates = False

    def __init__(self, settings: EstimatorSettings):
        super().__init__(settings)
        self.clusters = 0  # C, fixed by the first batch or query seen
        self.deviation: np.ndarray = np.zeros(0)  # sum of (share - q) since the last planned query
        self.updates = 0  # updates since the last planned query
        self.segments: list[tuple[int, list[float], int]] = []  # planned, unanswered: (query id, D, n)
        self.queries_planned = 0
        self.last_release: float | None = None
        self.baseline = 0.0  # EMA of the accuracy change per update (bias-corrected by baseline_updates)
        self.baseline_updates = 0
        self.gram: np.ndarray = np.zeros((0, 0))  # A
        self.moment: np.ndarray = np.zeros(0)  # v

    def _size(self, clusters: int) -> None:
        if self.clusters == 0:
            self.clusters = clusters
            self.deviation = np.zeros(clusters)
            self.gram = np.zeros((clusters, clusters))
            self.moment = np.zeros(clusters)
        elif clusters != self.clusters:
            raise ValueError(f"release_difference: {clusters} clusters, the estimator was built for {self.clusters}")

    def record_training(self, batch_clusters, q):
        self._size(len(q))
        if len(batch_clusters) == 0:
            return
        share = np.bincount(np.asarray(batch_clusters, dtype=np.int64), minlength=len(q)) / len(batch_clusters)
        self.deviation = self.deviation + (share - np.asarray(q, dtype=np.float64))
        self.updates += 1

    def plan(self, batch, batch_clusters, q, rng):
        self._size(len(q))
        query = self.queries_planned
        self.queries_planned += 1
        self.segments.append((query, self.deviation.tolist(), self.updates))
        self.deviation, self.updates = np.zeros(self.clusters), 0

        def conclude(accuracies: Sequence[float]) -> HypergradientEstimate:
            accuracy = float(_released(accuracies, 0)[0])
            return self._conclude(query, accuracy)

        return QueryPlan([], conclude)

    def _conclude(self, query: int, accuracy: float) -> HypergradientEstimate:
        # Every interval planned up to this query (a failed query's too) ends at this release.
        ended = [s for s in self.segments if s[0] <= query]
        self.segments = [s for s in self.segments if s[0] > query]
        deviation = np.sum([np.asarray(s[1]) for s in ended], axis=0) if ended else np.zeros(self.clusters)
        updates = sum(s[2] for s in ended)
        previous, self.last_release = self.last_release, accuracy
        nothing = HypergradientEstimate(np.zeros(self.clusters), np.zeros(self.clusters, dtype=bool))
        if previous is None or updates == 0:
            return nothing  # the first release only sets the reference
        change = accuracy - previous
        s = self.settings
        per_update = change / updates
        if self.baseline_updates == 0:
            residual = 0.0  # no baseline yet: this interval only teaches the baseline and the Gram matrix
        else:
            residual = change - updates * self.baseline / (1 - s.release_baseline_beta**self.baseline_updates)
        self.baseline = s.release_baseline_beta * self.baseline + (1 - s.release_baseline_beta) * per_update
        self.baseline_updates += 1
        self.gram = s.release_decay * self.gram + np.outer(deviation, deviation)
        self.moment = s.release_decay * self.moment + residual * deviation
        scale = float(np.mean(np.diag(self.gram)))
        observed = np.diag(self.gram) > 0
        if scale <= 0:
            return nothing
        grad = np.linalg.solve(self.gram + s.release_ridge * scale * np.eye(self.clusters), self.moment)
        return HypergradientEstimate(np.where(observed, grad, 0.0), observed)

    def state_dict(self) -> dict[str, Any]:
        return {
            "clusters": self.clusters,
            "deviation": self.deviation.tolist(),
            "updates": self.updates,
            "segments": [[q, list(d), n] for q, d, n in self.segments],
            "queries_planned": self.queries_planned,
            "last_release": self.last_release,
            "baseline": self.baseline,
            "baseline_updates": self.baseline_updates,
            "gram": self.gram.tolist(),
            "moment": self.moment.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        clusters = int(state["clusters"])
        gram = np.asarray(state["gram"], dtype=np.float64).reshape(clusters, clusters)
        deviation = np.asarray(state["deviation"], dtype=np.float64).reshape(clusters)
        moment = np.asarray(state["moment"], dtype=np.float64).reshape(clusters)
        segments = [(int(q), [float(x) for x in d], int(n)) for q, d, n in state["segments"]]
        if any(len(d) != clusters for _, d, _ in segments):
            raise ValueError(f"release_difference state: a segment does not have {clusters} clusters")
        last = state["last_release"]
        self.clusters, self.gram, self.deviation, self.moment, self.segments = (
            clusters, gram, deviation, moment, segments
        )
        self.updates, self.queries_planned = int(state["updates"]), int(state["queries_planned"])
        self.last_release = None if last is None else float(last)
        self.baseline, self.baseline_updates = float(state["baseline"]), int(state["baseline_updates"])
