"""Hypergradient estimators for L2RR's outer problem (docs/L2RR.md has the derivations).

The outer variable is the cluster distribution q. Each estimator spends ONE feedback query
(one multi-candidate release on one secret subsample) and returns an ascent direction for
the target accuracy of the model one update after training on the current batch:

- "lookahead": one candidate per cluster c in the batch, trained on c's groups only;
  g_c = acc(theta_c) - acc(theta). Estimates dAcc/dq_c (mirror-ascent coordinates).
- "spsa": two candidates whose batch is importance-reweighted to the cluster mixes
  q * exp(+-c_k * Delta); g = (y+ - y-) / (2 c_k) * Delta. Estimates dAcc/d(log q).

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
    """Released accuracies [base, *candidates] -> the estimate (raises ValueError on a wrong length)."""


class HypergradientEstimator(ABC):
    name: ClassVar[str] = ""  # set by registration

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
    """Per-cluster one-step lookahead: a paired finite difference per cluster."""

    def plan(self, batch, batch_clusters, q, rng):
        present = np.unique(batch_clusters)
        limit = self.settings.lookahead_max_clusters
        if 0 < limit < len(present):
            present = np.sort(rng.choice(present, size=limit, replace=False))
        weights = [
            [1.0 if c == cluster else 0.0 for c in batch_clusters.tolist()] for cluster in present.tolist()
        ]

        def conclude(accuracies: Sequence[float]) -> HypergradientEstimate:
            values = _released(accuracies, len(weights))
            grad = np.zeros(len(q))
            grad[present] = values[1:] - values[0]
            observed = np.zeros(len(q), dtype=bool)
            observed[present] = True
            return HypergradientEstimate(grad, observed)

        return QueryPlan(weights, conclude)


@ESTIMATORS.register("spsa")
class SpsaEstimator(HypergradientEstimator):
    """Simultaneous-perturbation estimate from one paired (+, -) candidate query."""

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

    def state_dict(self) -> dict[str, Any]:
        return {"iterations": self.iterations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iterations = int(state["iterations"])
