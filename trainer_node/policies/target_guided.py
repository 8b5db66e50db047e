"""The paper's Table 6 baselines: simple target-guided samplers on L2RR's feedback interface.

The paper names them only ("simple target-guided baselines that use the same target-feedback
interface"); these are the closest versions that use released accuracies only (docs/L2RR.md
section 9). Both spend feedback exactly as L2RR does: when the trainer allows a query, ONE
release of the current model and one lookahead candidate per cluster in the batch (or any
registered estimator), giving each observed cluster an estimated effect on target accuracy,
e_c = acc(theta_c) - acc(theta). What they do with it is simpler than L2RR's mirror ascent:

- `target_threshold` (gradient-similarity thresholding): a cluster is sampled only while its
  estimated effect (an EMA over its estimates, `smoothing`) is at least `threshold`; the
  clusters above it share q uniformly. A cluster never measured yet counts as above. If none
  is above, the one with the highest effect is sampled.
- `target_softmax` (target-loss reweighting): q = softmax(e / temperature) over the latest
  estimated effect of each cluster (0 before its first), with no waste penalty and no
  mirror-ascent state (no logits accumulate across queries).

Both keep `q_floor` of the mass uniform, so a cluster that fell out is still drawn now and
then and can be measured again (the lookahead sees only clusters in the batch). The source
side is plain: prompts uniform within a cluster (no waste weighting), every prompt n rollouts,
no oversampling; zero-variance groups are dropped as in every policy here. They reuse
L2RR's query machinery (synchronous or asynchronous, `max_staleness`) and its logging.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from trainer_node.policies.base import POLICIES, SourcePool
from trainer_node.policies.l2rr import L2rrOptions, L2rrPolicy
from trainer_node.policies.l2rr_estimators import HypergradientEstimate


class _TargetGuidedOptions(L2rrOptions):
    """L2RR's options with its source-side parts off by default (they are not part of these baselines)."""

    waste_penalty: bool = Field(default=False, description="false: prompts uniform within a cluster.")
    rollout_allocation: bool = Field(default=False, description="false: every prompt gets n rollouts.")
    oversample: float = Field(default=1.0, ge=1, description="1: no oversampling, no selection.")

    sweep_parameter: ClassVar[str | None] = None

    def sweep_value(self) -> float | None:
        return None


class TargetThresholdOptions(_TargetGuidedOptions):
    name: Literal["target_threshold"] = Field(  # type: ignore[assignment]
        default="target_threshold",
        description="Table 6 baseline: sample a cluster only while its estimated target effect >= threshold.")
    threshold: float = Field(default=0.0, description="Estimated effect on target accuracy (accuracy units) "
                             "a cluster needs to stay sampled.")
    smoothing: float = Field(default=0.5, ge=0, lt=1, description="EMA weight of a cluster's previous "
                             "effect estimate (0: the latest estimate alone).")


class TargetSoftmaxOptions(_TargetGuidedOptions):
    name: Literal["target_softmax"] = Field(  # type: ignore[assignment]
        default="target_softmax",
        description="Table 6 baseline: q = softmax of the latest estimated target effects / temperature.")
    temperature: float = Field(default=0.02, gt=0, description="Softmax temperature in accuracy units "
                               "(about the DP noise of one release at the simulated owner's settings).")


class _TargetGuidedPolicy(L2rrPolicy):
    """L2RR's sampling and query machinery, with q set from per-cluster effect estimates."""

    def __init__(self, pool: SourcePool, options: Any, rng: np.random.Generator):
        super().__init__(pool, options, rng)
        self.effects = np.zeros(len(self.cluster_names))      # (C,) estimated effect per cluster
        self.measured = np.zeros(len(self.cluster_names), dtype=bool)

    def q(self) -> np.ndarray:
        floor = self.options.q_floor
        return (1.0 - floor) * self.weights() + floor / len(self.cluster_names)

    def weights(self) -> np.ndarray:
        raise NotImplementedError

    def apply_hypergradient(self, estimate: HypergradientEstimate) -> None:
        observed = np.asarray(estimate.observed, dtype=bool)
        self.last_hypergrad = np.asarray(estimate.grad, dtype=np.float64).copy()
        self.record_effects(observed, self.last_hypergrad)
        self.measured |= observed

    def record_effects(self, observed: np.ndarray, effects: np.ndarray) -> None:
        self.effects[observed] = effects[observed]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "effects": self.effects.tolist(), "measured": self.measured.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        effects = np.asarray(state["effects"], dtype=np.float64)
        measured = np.asarray(state["measured"], dtype=bool)
        if effects.shape != self.effects.shape or measured.shape != self.measured.shape:
            raise ValueError(f"{self.options.name} state has {effects.size} effects, this pool has "
                             f"{self.effects.size} clusters")
        super().load_state_dict(state)
        self.effects, self.measured = effects, measured

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        out.pop("hypergrad_scale", None)  # no normaliser here
        for c, name in enumerate(self.cluster_names):
            out[f"effect/{name}"] = float(self.effects[c])
        return out


@POLICIES.register("target_threshold", options=TargetThresholdOptions)
class TargetThresholdPolicy(_TargetGuidedPolicy):
    options: TargetThresholdOptions

    def record_effects(self, observed: np.ndarray, effects: np.ndarray) -> None:
        keep = self.options.smoothing
        first = observed & ~self.measured
        again = observed & self.measured
        self.effects[first] = effects[first]
        self.effects[again] = keep * self.effects[again] + (1 - keep) * effects[again]

    def active(self) -> np.ndarray:
        """Clusters sampled now: never measured, or estimated effect >= threshold (at least one)."""
        active = ~self.measured | (self.effects >= self.options.threshold)
        if not active.any():
            active = self.effects == self.effects.max()
        return active

    def weights(self) -> np.ndarray:
        active = self.active().astype(np.float64)
        return active / active.sum()


@POLICIES.register("target_softmax", options=TargetSoftmaxOptions)
class TargetSoftmaxPolicy(_TargetGuidedPolicy):
    options: TargetSoftmaxOptions

    def weights(self) -> np.ndarray:
        z = self.effects / self.options.temperature
        z = np.exp(z - z.max())
        return z / z.sum()
