"""L2RR: learning-to-reweight rollout (seed 000). The derivation is in docs/L2RR.md.

Per step:
  1. Draw ceil(oversample * B) distinct candidates: a cluster from q, then a prompt inside it
     with probability ~ exp(-lambda * waste_i) (waste_i: the prompt's zero-variance streak).
  2. Keep the B candidates with the lowest predicted waste (Beta-binomial probability that
     n fresh rollouts all agree, from the prompt's recent history; unseen prompts rank high).
  3. Allocate rollouts by the prompt's Bernoulli variance: n * 4p(1-p), clipped to [min, n].
  4. Train on the groups with reward variance (zero-variance groups have zero GRPO gradient).
  5. If the trainer allows a feedback query this step, spend ONE query on a hypergradient of
     target accuracy w.r.t. q (estimator: "lookahead", "spsa" or "release_difference",
     l2rr_estimators.py; engines that own their step call after_update instead) and take
     a mirror-ascent step on q's logits: eta_q * gain * (normalised hypergradient
     - lambda * centred cluster waste). With max_staleness > 0 the query is asynchronous:
     training goes on, and the step is taken exactly max_staleness steps later (waiting for
     the release if it is late), or with fixed_staleness = false when it arrives.

Ablations (paper Table 2): waste_penalty=false is "w/o ws" (lambda = 0 everywhere),
rollout_allocation=false gives every prompt n rollouts, learn_q=false is "uniform q".
The default estimator "lookahead" is provisional: the choice between estimators is to be
made by measurement in integration, not asserted here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from trainer_node.feedback.release import ReleaseOptions
from trainer_node.policies.base import (
    POLICIES,
    DataPolicy,
    FeedbackContext,
    Group,
    PendingFeedback,
    RolloutRequest,
    SourcePool,
    StepRollouts,
    informative_groups,
    send_query,
)
from trainer_node.policies.l2rr_estimators import (
    EstimatorSettings,
    HypergradientEstimate,
    QueryPlan,
    build_estimator,
    candidate_free_estimators,
    estimator_class,
    estimator_names,
)
from trainer_node.policies.l2rr_rules import (
    PromptHistory,
    allocate_rollouts,
    mixed_distribution,
    predicted_waste,
)
from trainer_node.policies.options import CandidateNeed, PolicyOptions


class L2rrOptions(PolicyOptions):
    name: Literal["l2rr"] = Field(default="l2rr", description="L2RR: learning-to-reweight rollout.")
    lambda_waste: float = Field(
        default=0.25, ge=0, description="Waste weight lambda (the paper's best, Fig. 2 / Table 8)."
    )
    waste_penalty: bool = Field(
        default=True, description='false: the "w/o ws" ablation (lambda = 0 everywhere).'
    )
    rollout_allocation: bool = Field(default=True, description="false: every prompt gets n rollouts.")
    waste_in_q: bool = Field(
        default=True,
        description="Apply the waste term -lambda * (cluster waste - mean) in q's update too (the paper's outer "
        "objective). false keeps it inside clusters only (draws and selection): docs/L2RR.md 4.3 says when the "
        "cluster-level term steers q away from a skill whose groups are often all-correct.",
    )
    learn_q: bool = Field(default=True, description='false: the "uniform q" ablation (no feedback queries).')
    q_prior: Literal["uniform", "pool"] = Field(
        default="uniform",
        description="Where q starts: 'uniform' (every cluster 1/C, the paper's start) or 'pool' (each cluster's "
        "share of the pool, so that q starts where uniform sampling over prompts is and learn_q = false "
        "matches the uniform baseline's mix; docs/RESULTS.md 11.1 measured both on unequal clusters).",
    )
    oversample: float = Field(
        default=1.5, ge=1, description="Candidates per batch slot (the paper: 384 for B = 256)."
    )
    estimator: str = Field(
        default="lookahead",
        description="Hypergradient estimator (l2rr_estimators.py): 'lookahead' (provisional default) or "
        "'spsa' (both need lookahead candidates: this project's own loop only), or 'release_difference' "
        "(releases of the current model only: any engine, TRL and verl included).",
    )
    eta_q: float = Field(default=0.1, ge=0, description="Mirror-ascent step on the cluster logits per query.")
    q_floor: float = Field(
        default=0.05, ge=0, lt=1, description="Total mass spread uniformly: each cluster keeps >= q_floor / "
        "C."
    )
    max_waste: int = Field(
        default=18, ge=1, description="Waste counter cap: exp(-0.25 * 18) ~ 0.011, GRESO's 0.01 keep floor."
    )
    min_rollouts: int = Field(
        default=2, ge=2, description="Fewest rollouts a prompt is given (>= 2, so its variance is defined)."
    )
    grad_norm_beta: float = Field(
        default=0.9, ge=0, lt=1, description="EMA of the hypergradient's mean square (its scale normaliser)."
    )
    grad_clip: float = Field(default=3.0, gt=0, description="Cap on |normalised hypergradient| per cluster.")
    lookahead_max_clusters: int = Field(
        default=0, ge=0, description="Lookahead candidates per query; 0 = one per cluster in the batch."
    )
    spsa_a: float = Field(default=1.0, gt=0, description="SPSA step gain at k = 0.")
    spsa_A: float = Field(default=10.0, ge=0, description="SPSA stability constant A.")
    spsa_c: float = Field(default=0.5, gt=0, description="SPSA perturbation size in log-weight space.")
    release_decay: float = Field(
        default=0.8, gt=0, le=1, description="release_difference: weight kept per query by older "
        "(trained-mix deviation, accuracy change) pairs of its regression."
    )
    release_ridge: float = Field(
        default=0.1, gt=0, description="release_difference: ridge of its regression, relative to the mean "
        "squared deviation."
    )
    release_baseline_beta: float = Field(
        default=0.8, ge=0, lt=1, description="release_difference: EMA of the accuracy change per update (the "
        "baseline taken off each change)."
    )
    max_staleness: int = Field(
        default=8, ge=0,
        description="Asynchronous feedback: a query's release updates q at most this many steps after the "
        "query (training waits for it only then); 0 = synchronous (the step waits). With fixed_staleness (the "
        "default) it lands exactly then. 8 is about what a simulated owner sharing 2 cores takes to answer "
        "(7-8 steps); at 12 seeds it matched the synchronous mode's accuracy (docs/RESULTS.md 6.16).",
    )
    release_base: bool = Field(
        default=False,
        description="Score the live model in every lookahead (and SPSA) release beside the candidates. Their "
        "estimates use only differences between candidates, so the base is left out by default: one "
        "checkpoint fewer per query to upload and score, and less epsilon per release. true reproduces "
        "runs from before it was left out.",
    )
    release: ReleaseOptions = Field(
        default_factory=ReleaseOptions,
        description="What each query asks the owner to release (trainer_node/feedback/release.py): kind "
        "'accuracy' (the candidates' noisy accuracies) or 'difference' (each candidate's clipped accuracy change "
        "from the live model, noise calibrated to the clip chosen from the trainer's own prompts), with its "
        "metric and clip.",
    )
    fixed_staleness: bool = Field(
        default=True,
        description="Apply every release exactly max_staleness steps after its query (waiting for it if it "
        "is late), never when it happens to arrive: the run then does not depend on how fast the owner "
        "answers or how loaded the machine is, so one seed gives one run. false: a release lands when it "
        "arrives (the next step after), which trades that for q a few steps fresher in a deployment whose "
        "owner answers fast; the run then depends on timing.",
    )

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, name: str) -> str:
        if name not in estimator_names():
            raise ValueError(f"must be one of {estimator_names()}, got {name!r}")
        return name

    sweep_parameter: ClassVar[str | None] = "lambda_waste"

    @property
    def effective_lambda(self) -> float:
        return self.lambda_waste if self.waste_penalty else 0.0

    def sweep_value(self) -> float | None:
        return self.effective_lambda

    def estimator_settings(self) -> EstimatorSettings:
        return EstimatorSettings(
            lookahead_max_clusters=self.lookahead_max_clusters,
            spsa_a=self.spsa_a,
            spsa_A=self.spsa_A,
            spsa_c=self.spsa_c,
            release_decay=self.release_decay,
            release_ridge=self.release_ridge,
            release_baseline_beta=self.release_baseline_beta,
        )

    def candidate_need(self) -> CandidateNeed | None:
        if not self.learn_q or not estimator_class(self.estimator).needs_candidates:
            return None
        return CandidateNeed(
            field="estimator",
            fix=f"set policy.estimator to one that needs only releases of the current model "
            f"({', '.join(repr(n) for n in candidate_free_estimators())}), or policy.learn_q = false",
        )


@dataclass(frozen=True)
class InFlightQuery:
    """A feedback query sent at `step` whose release has not been applied yet."""

    step: int
    plan: QueryPlan
    pending: PendingFeedback
    differences: bool = False
    """A difference release: its values are the candidates' changes from the base (read as [0, *values])."""


@POLICIES.register("l2rr", options=L2rrOptions)
class L2rrPolicy(DataPolicy):
    uses_target_feedback = True
    cluster_sampler = True  # in an engine: clusters ~ q, prompts uniform inside (docs/SCALE.md)
    options: L2rrOptions

    def __init__(self, pool: SourcePool, options: L2rrOptions, rng: np.random.Generator):
        super().__init__(pool, options, rng)
        self.cluster_names = pool.cluster_names
        position = {name: c for c, name in enumerate(self.cluster_names)}
        self.cluster_of = np.array([position[c] for c in pool.clusters], dtype=np.int64)  # (N,)
        self.cluster_sizes = np.bincount(self.cluster_of, minlength=len(self.cluster_names))  # (C,)
        self.estimator = build_estimator(self.options.estimator, self.options.estimator_settings())
        self.logits = self._prior_logits()
        self.history = self._indexed(PromptHistory.empty(len(pool)))
        self.grad_sq = 0.0  # EMA of the centred hypergradient's mean square
        self.grad_updates = 0  # EMA bias correction count
        self.last_hypergrad = np.zeros(len(self.cluster_names))
        self.feedback_queries = 0
        self.feedback_failures = 0
        self.last_staleness = 0  # steps between the last applied release's query and its use
        self._in_flight: InFlightQuery | None = None  # asynchronous feedback (max_staleness > 0)
        self._step_metrics: dict[str, float] = {}

    def _prior_logits(self) -> np.ndarray:
        if self.options.q_prior == "pool":
            logits = np.log(np.maximum(self.cluster_sizes, 1).astype(np.float64))
            return logits - logits.mean()
        return np.zeros(len(self.cluster_names))

    # --- sampling -------------------------------------------------------------------------

    def q(self) -> np.ndarray:
        return mixed_distribution(self.logits, self.options.q_floor)

    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        if so_far.rounds > 0:
            return []
        n = self.options.rollouts_per_prompt
        batch = min(self.options.batch_size, len(self.pool))
        wanted = min(len(self.pool), max(batch, math.ceil(self.options.oversample * batch - 1e-9)))
        candidates = self.draw_candidates(wanted)
        successes, failures = self.history.evidence(candidates)
        waste_risk = predicted_waste(successes, failures, n)
        keep = np.argsort(waste_risk, kind="stable")[:batch]  # candidates are in random order: ties random
        chosen = candidates[keep]
        if self.options.rollout_allocation:
            s, f = successes[keep], failures[keep]
            rollouts = allocate_rollouts((1.0 + s) / (2.0 + s + f), n, self.options.min_rollouts)
        else:
            rollouts = np.full(len(chosen), n, dtype=np.int64)
        self._step_metrics = {
            "candidates": float(len(candidates)),
            "rollouts_requested": float(rollouts.sum()),
            "rollouts_saved": float(len(chosen) * n - rollouts.sum()),
            "predicted_waste_kept": float(waste_risk[keep].mean()) if len(keep) else 0.0,
        }
        # Realised share per cluster after selection (q is the share before it).
        counts = np.bincount(self.cluster_of[chosen], minlength=len(self.cluster_names))
        for name, count in zip(self.cluster_names, counts.tolist()):
            self._step_metrics[f"share/{name}"] = count / max(len(chosen), 1)
        return [RolloutRequest(int(i), int(r)) for i, r in zip(chosen, rollouts)]

    def draw_candidates(self, count: int) -> np.ndarray:
        """`count` distinct prompts: clusters ~ q, within a cluster ~ exp(-lambda * waste), random order.

        O(count * waste levels), never a pass over the pool (policies/waste_index.py)."""
        q = self.q()
        sizes = self.cluster_sizes
        per_cluster = np.minimum(self.rng.multinomial(count, q), sizes)
        while per_cluster.sum() < count:  # a cluster ran out of prompts: redraw the excess among the rest
            room = sizes - per_cluster
            p = q * (room > 0)
            per_cluster += np.minimum(self.rng.multinomial(count - per_cluster.sum(), p / p.sum()), room)
        lam = self.options.effective_lambda
        index = self.history.index
        picks = [index.draw(c, take, lam, self.rng) for c, take in enumerate(per_cluster.tolist()) if take > 0]
        return self.rng.permutation(np.concatenate(picks)) if picks else np.zeros(0, dtype=np.int64)

    # --- after rollout --------------------------------------------------------------------

    def training_groups(self, step: int, so_far: StepRollouts) -> list[Group]:
        kept = informative_groups(so_far.groups)
        total = max(len(so_far.groups), 1)
        self._step_metrics.update(
            {
                "kept_groups": float(len(kept)),
                "zero_variance_frac": float(sum(g.zero_variance for g in so_far.groups) / total),
                "rollouts_generated": float(so_far.rollouts_generated),
            }
        )
        return kept

    def observe(self, step: int, groups: Sequence[Group]) -> None:
        if not groups:
            return
        size = len(groups)
        self.history.record_groups(
            np.fromiter((g.index for g in groups), dtype=np.int64, count=size),
            np.fromiter((g.mean_reward for g in groups), dtype=np.float64, count=size),
            np.fromiter((len(g.rollouts) for g in groups), dtype=np.int64, count=size),
            np.fromiter((g.zero_variance for g in groups), dtype=bool, count=size),
            self.options.max_waste,
        )

    def before_update(self, step: int, batch: Sequence[Group], feedback: FeedbackContext | None) -> None:
        self.collect_feedback(step)  # a release that arrived since the last step
        self._maybe_query(step, batch, feedback)  # about the model before this batch's update
        self._record_trained(batch)

    def after_update(self, step: int, batch: Sequence[Group], feedback: FeedbackContext | None) -> None:
        """For an engine that runs the update itself (trainer_node/integrations/): `batch` is trained
        now, and a query measures the model with it. Only estimators without candidates can be asked
        here (the config check refuses the others before a run starts)."""
        if feedback is not None and self.estimator.needs_candidates and self.options.learn_q:
            raise RuntimeError(
                f"policy.estimator = {self.options.estimator!r} needs lookahead candidates, which this engine "
                f"cannot build; use one of {candidate_free_estimators()}"
            )
        self.collect_feedback(step)
        self._record_trained(batch)
        self._maybe_query(step, batch, feedback)

    def _record_trained(self, batch: Sequence[Group]) -> None:
        if self.options.learn_q and batch:
            self.estimator.record_training(self.cluster_of[[g.index for g in batch]], self.q())

    def _maybe_query(self, step: int, batch: Sequence[Group], feedback: FeedbackContext | None) -> None:
        if not self.options.learn_q or feedback is None or self._in_flight is not None:
            return
        directions = self._direction_mask(feedback)  # candidates along running cluster directions, if offered
        batch_clusters = self.cluster_of[[g.index for g in batch]] if batch else np.zeros(0, dtype=np.int64)
        if self.estimator.needs_candidates:
            seen = directions.sum() if directions is not None else len(np.unique(batch_clusters))
            if seen < 2:
                return  # one cluster: no relative information about q, don't spend budget
        if not feedback.should_query(step):
            return
        plan = None
        if directions is not None:
            plan = self.estimator.plan_directions(directions, self.q(), self.rng)
        if plan is None:
            plan = self.estimator.plan(batch, batch_clusters, self.q(), self.rng)
        mixtures = None if plan.mixtures is None else [
            {self.cluster_names[c]: float(share) for c, share in enumerate(mix) if share} for mix in plan.mixtures]
        # an accuracy release is every context's default: only a difference release is named
        release = self.options.release if self.estimator.needs_candidates and self.options.release.is_difference \
            else None
        pending = send_query(feedback, batch, plan.weights, asynchronous=self.options.max_staleness > 0,
                             with_base=self.options.release_base or self.estimator.needs_base,
                             mixtures=mixtures, release=release)
        self._in_flight = InFlightQuery(step, plan, pending, release is not None)
        self.collect_feedback(step)  # synchronous (max_staleness = 0): applied in this step

    def _direction_mask(self, feedback: FeedbackContext) -> np.ndarray | None:
        """(C,) bool: the clusters the trainer has a running direction for; None when it builds candidates
        from the batch (grpo.lookahead_directions = batch) or the estimator needs none."""
        offered = getattr(feedback, "direction_clusters", None)
        names = offered() if offered is not None and self.estimator.needs_candidates else []
        if not names:
            return None
        position = {name: c for c, name in enumerate(self.cluster_names)}
        mask = np.zeros(len(self.cluster_names), dtype=bool)
        mask[[position[n] for n in names if n in position]] = True
        return mask

    def collect_feedback(self, step: int, wait: bool = False) -> None:
        """Apply the query in flight if its release is in, or if it is `max_staleness` steps old
        (then wait for it: staleness stays bounded). `wait` forces it (the run's end)."""
        query = self._in_flight
        if query is None:
            return
        age = step - query.step
        arrived = query.pending.ready() and not self.options.fixed_staleness  # fixed: its arrival is not read
        if not (wait or arrived or age >= self.options.max_staleness):
            return
        accuracies = query.pending.result()
        self._in_flight = None
        self.last_staleness = age
        if accuracies is None:
            self.feedback_failures += 1
            return
        self.feedback_queries += 1
        values = [0.0, *accuracies] if query.differences else accuracies  # the base's change from itself: 0
        self.apply_hypergradient(query.plan.conclude(values))

    def apply_hypergradient(self, estimate: HypergradientEstimate) -> None:
        """One mirror-ascent step on the logits from a hypergradient and the waste penalty.

        The hypergradient is centred over the clusters it observed and divided by a running
        RMS (bias-corrected EMA of its mean square), so eta_q is a step in logit units
        whatever the accuracy scale or DP noise level; unobserved clusters get 0.
        """
        observed = estimate.observed
        if not observed.any():
            return  # nothing learnt (e.g. release_difference's first release): q and the scale stay
        grad = np.where(observed, estimate.grad, 0.0)
        if observed.any():
            grad[observed] -= grad[observed].mean()
        self.last_hypergrad = np.asarray(estimate.grad, dtype=np.float64).copy()
        beta = self.options.grad_norm_beta
        mean_sq = float(np.mean(grad[observed] ** 2)) if observed.any() else 0.0
        self.grad_sq = beta * self.grad_sq + (1 - beta) * mean_sq
        self.grad_updates += 1
        scale = self.hypergrad_scale()
        normalised = (
            np.clip(grad / scale, -self.options.grad_clip, self.options.grad_clip) if scale > 0 else grad * 0
        )
        cluster_waste = self.history.index.cluster_waste()
        weight = self.options.effective_lambda if self.options.waste_in_q else 0.0
        penalty = weight * (cluster_waste - cluster_waste.mean())
        self.logits = self.logits + self.options.eta_q * estimate.gain * (normalised - penalty)
        self.logits -= self.logits.mean()

    # --- checkpoint and logs --------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "clusters": list(self.cluster_names),
            "logits": self.logits.tolist(),
            "history": self.history.state_dict(),
            "bucket_order": self.history.index.order.tolist(),
            "estimator": self.estimator.state_dict(),
            "grad_sq": self.grad_sq,
            "grad_updates": self.grad_updates,
            "last_hypergrad": self.last_hypergrad.tolist(),
            "feedback_queries": self.feedback_queries,
            "feedback_failures": self.feedback_failures,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Validate everything before assigning anything: a bad checkpoint changes nothing.
        if list(state["clusters"]) != self.cluster_names:
            raise ValueError(
                f"l2rr state is for clusters {state['clusters']}, this pool has {self.cluster_names}"
            )
        history = self._indexed(PromptHistory.from_state(state["history"], len(self.pool)), state.get("bucket_order"))
        logits = np.asarray(state["logits"], dtype=np.float64)
        last_hypergrad = np.asarray(state["last_hypergrad"], dtype=np.float64)
        if logits.shape != self.logits.shape or last_hypergrad.shape != self.logits.shape:
            raise ValueError(
                f"l2rr state has {logits.size} logits, this pool has {self.logits.size} clusters"
            )
        estimator = build_estimator(self.options.estimator, self.options.estimator_settings())
        estimator.load_state_dict(state["estimator"])
        grad_sq, grad_updates = float(state["grad_sq"]), int(state["grad_updates"])
        queries, failures = int(state["feedback_queries"]), int(state["feedback_failures"])
        self.history, self.logits, self.last_hypergrad, self.estimator = (
            history,
            logits,
            last_hypergrad,
            estimator,
        )
        self.grad_sq, self.grad_updates = grad_sq, grad_updates
        self.feedback_queries, self.feedback_failures = queries, failures

    def metrics(self) -> dict[str, float]:
        out = dict(self._step_metrics)
        q = self.q()
        waste = self.history.index.cluster_waste()
        for c, name in enumerate(self.cluster_names):
            out[f"q/{name}"] = float(q[c])
            out[f"waste/{name}"] = float(waste[c])
            out[f"hypergrad/{name}"] = float(self.last_hypergrad[c])
        out["feedback_queries"] = float(self.feedback_queries)
        out["feedback_failures"] = float(self.feedback_failures)
        out["feedback_staleness"] = float(self.last_staleness)
        out["feedback_in_flight"] = float(self._in_flight is not None)
        out["hypergrad_scale"] = self.hypergrad_scale()
        return out

    def _indexed(self, history: PromptHistory, order: Any = None) -> PromptHistory:
        """The history with its WasteIndex; `order` is a checkpoint's bucket_order (None: rebuilt)."""
        return history.indexed(
            self.cluster_of, len(self.cluster_names), self.options.max_waste,
            None if order is None else np.asarray(order, dtype=np.int64),
        )

    def hypergrad_scale(self) -> float:
        """Running RMS the hypergradient is divided by (0 before the first query)."""
        if self.grad_updates == 0:
            return 0.0
        return math.sqrt(self.grad_sq / (1 - self.options.grad_norm_beta**self.grad_updates))
