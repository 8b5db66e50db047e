"""setgrpo: Set-Valued GRPO for noisy graders (seed 002), the advantage stage's coefficient
module. Maths in trainer_node/grpo/setgrpo.py; derivations, the map to the seed and every
choice of ours in docs/SETGRPO.md.

Per step, over the batch's groups (grader draws s1, s2, s3 per rollout, the LM head geometry):
  1. each group's joint set is built from its two draws: centre m = (a(s1) + a(s2)) / 2 (the
     point coefficients), scale s = ||a(s1) - a(s2)|| + floor, set {c : ||c - m|| <= q s};
  2. a seeded ceil(calibration_fraction * G) groups are held back (not kept: they do not
     train; their rollouts are generated, so they count toward the rollouts of the RO ratio),
     into the coverage or the risk calibration window by a fixed pattern (a `risk_share` of
     them to risk: independent calibrations); on them the third draw s3 is the fresh,
     exchangeable draw the set must cover; both windows pool groups across steps;
  3. (a) q = the split-conformal (1 - alpha) quantile of ||a(s3) - m|| / s over the coverage window;
  4. (c) tau_sel from the risk window, every record re-evaluated at this step's q (the gate the
     training groups meet): a risk group's recovered coefficients are a direction reversal when
     their update opposes the update of a(s3); thresholds certified by fixed-sequence testing;
  5. for each training group: (b) the recovered coefficients a(eta*); accepted when
     rho >= tau_sel and the reward-space projection is > 0; a rejected group trains on its point
     coefficients m (`rejected = "point"`, the default: the original GRPO objective) or is not
     kept (`rejected = "skip"`).
Until both windows hold `min_calibration` groups the training groups get the point coefficients m
ungated (logged as setgrpo/calibrated = 0). Training groups read only s1 and s2.

The windows (and the held-back rng) are the module's state_dict: a resumed run keeps them.

Ablations (seed Table 5): set_shape = "sphere" (spherical set), geometry = "identity" (G = I),
recovery = "anchor_only" (eta = 0: the safe anchor).
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from trainer_node.grpo import setgrpo as sg
from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import COEFFICIENTS, CoefficientRule, Coefficients, UpdateInput


class SetGrpoOptions(UpdateRuleOptions):
    name: Literal["setgrpo"] = Field(default="setgrpo", description="SetGRPO: calibrated, recovered, "
                                     "risk-gated coefficients from two grader draws.")
    alpha: float = Field(default=0.1, gt=0.0, lt=1.0, description="(a) miscoverage: the joint set covers a "
                         "fresh draw's coefficients with probability >= 1 - alpha.")
    beta: float = Field(default=0.08, gt=0.0, lt=1.0, description="(c) bound on the direction-reversal risk "
                        "of accepted updates (seed: 0.08).")
    delta: float = Field(default=0.1, gt=0.0, lt=1.0, description="(c) the risk bound holds with probability "
                         ">= 1 - delta over the calibration draws.")
    calibration_fraction: float = Field(default=0.25, gt=0.0, lt=1.0, description="Share of each batch's groups "
                                        "held back for calibration (at least one group per step).")
    calibration_window: int = Field(default=512, ge=4, description="Most recent held-back groups kept per "
                                    "calibration window (coverage, risk).")
    min_calibration: int = Field(default=64, ge=1, description="Groups each window needs before SetGRPO "
                                 "gates updates; before that, the point coefficients ungated. (A threshold needs "
                                 ">= log(delta) / log(1 - beta) accepted risk groups: 28 at beta = 0.08, delta = "
                                 "0.1, with no reversal.)")
    risk_share: float = Field(default=0.5, gt=0.0, lt=1.0, description="Share of the held-back groups that go "
                              "to the risk window (the rest: the coverage window), by a fixed pattern.")
    thresholds: int = Field(default=10, ge=1, le=200, description="Candidate tau_sel values, evenly spaced on "
                            "[0, threshold_max], tested in sequence from the top, each at level delta.")
    threshold_max: float = Field(default=0.9, ge=0.0, lt=1.0, description="The most conservative candidate "
                                 "tau_sel (the first one tested).")
    set_shape: Literal["box", "sphere"] = Field(default="box", description="(a) the joint set: 'box' (sup "
                                                "norm, ours) or 'sphere' (the seed's spherical-set ablation).")
    geometry: Literal["policy", "identity"] = Field(default="policy", description="(b) 'policy': the LM "
                                                    "head Gram matrix; 'identity': G = I (ablation).")
    recovery: Literal["largest_safe", "anchor_only"] = Field(default="largest_safe", description="(b) "
                                                             "'anchor_only': eta = 0 always (ablation).")
    disagreement_floor: float = Field(default=0.5, gt=0.0, description="(a) s_g = ||a(s1) - a(s2)|| + this: "
                                      "the set's scale for a group whose two draws agree (coefficient units).")
    reference_draws: int = Field(default=1, ge=1, le=32, description="Fresh grader draws per rollout of a "
                                 "held-back group, averaged into the reference the set must cover and the risk "
                                 "gate's reversal is measured against (the grader is asked for 2 + this many).")
    rejected: Literal["point", "skip"] = Field(default="point", description="(c) what a training group "
                                               "the gate rejects trains on: 'point', its point coefficients m "
                                               "(the GRPO objective on the two draws, as before calibration: "
                                               "the seed keeps the original GRPO objective); 'skip', nothing "
                                               "(the group is not kept; a step with nothing accepted is skipped).")
    zero_update_tol: float = Field(default=0.0, ge=0.0, lt=1.0, description="(c) a recovered update with "
                                   "||a(eta*)||_2 <= this x ||m||_2 is no update (never accepted, not a risk "
                                   "record), as an exact zero is. With a zero safe anchor the bisection can end "
                                   "at a vanishing eta* (within its tolerance of 0), an update of ~1e-7 of m "
                                   "that the exact test (0, the default) keeps as gateable (docs/SETGRPO.md, 'The gate question').")
    eps: float = Field(default=1e-6, gt=0.0, description="Added to each group's score std.")
    seed: int = Field(default=0, ge=0, description="Seeds the choice of held-back groups.")


@dataclass(frozen=True)
class HeldBackGroup:
    """A held-back group as calibration keeps it: its set (centre, scale), the fresh draw's
    coefficients and its geometry. Kept whole, not as a (rho, reversed) record, so that every
    step re-evaluates it at the current quantile q: the records then meet the same gate as the
    training groups they calibrate."""

    centre: torch.Tensor  # m (K,)
    scale: float          # s = ||a(s1) - a(s2)|| + floor
    target: torch.Tensor  # a(s3) (K,)
    gram: torch.Tensor    # G (K, K)

    def to_state(self) -> dict[str, Any]:
        return {"centre": self.centre.tolist(), "scale": self.scale, "target": self.target.tolist(),
                "gram": self.gram.tolist()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> HeldBackGroup:
        def as_tensor(values: list) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float64)

        return cls(as_tensor(state["centre"]), float(state["scale"]), as_tensor(state["target"]),
                   as_tensor(state["gram"]))


class GroupWindow:
    """The most recent `maxlen` held-back groups, pooled across steps, and their records at a
    quantile q (cached while q stays the same: only the groups added since are evaluated)."""

    def __init__(self, maxlen: int):
        self.groups: deque[HeldBackGroup] = deque(maxlen=maxlen)
        self.added = 0  # groups ever appended: tells the cache which ones it has not seen
        self._cache: tuple[float, int, list[Any]] = (math.nan, 0, [])

    def __len__(self) -> int:
        return len(self.groups)

    def append(self, group: HeldBackGroup) -> None:
        self.groups.append(group)
        self.added += 1

    def records(self, q: float, evaluate: Callable[[HeldBackGroup], Any]) -> list[Any]:
        cached_q, seen, cached = self._cache
        if cached_q != q:
            seen, cached = self.added - len(self.groups), []
        unseen = min(self.added - seen, len(self.groups))  # appends only, dropping the oldest at maxlen
        window = list(self.groups)
        cached = cached + [evaluate(group) for group in window[len(window) - unseen:]]
        cached = cached[len(cached) - len(window):]
        self._cache = (q, self.added, cached)
        return cached

    def state_dict(self) -> list[dict[str, Any]]:
        return [group.to_state() for group in self.groups]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self.groups.clear()
        self.groups.extend(HeldBackGroup.from_state(g) for g in state)
        self.added, self._cache = len(self.groups), (math.nan, 0, [])


@COEFFICIENTS.register("setgrpo", options=SetGrpoOptions)
class SetGrpo(CoefficientRule):
    options: SetGrpoOptions
    requires = frozenset({"grader_scores", "group_geometry"})
    grader_draws = 3  # two build each group's set; the others, on held-back groups only, are the fresh draws

    def __init__(self, options: SetGrpoOptions):
        super().__init__(options)
        if options.geometry == "identity":  # G = I needs no features: skip the geometry pass
            self.requires = frozenset({"grader_scores"})
        self.grader_draws = 2 + options.reference_draws
        window = options.calibration_window
        self.coverage_window: deque[float] = deque(maxlen=window)      # nonconformities R
        self.risk_window = GroupWindow(window)   # (c) the test split of the risk calibration
        self.order_window = GroupWindow(window)  # coverage groups again: (c)'s ordering split
        self.rng = np.random.default_rng(options.seed)
        self.held_back_total = 0
        self.coverage_hits = 0
        self.coverage_tests = 0
        self.grid = [options.threshold_max * i / max(options.thresholds - 1, 1) for i in range(options.thresholds)]
        self._metrics: dict[str, float] = {}
        self._last: tuple[str, Coefficients] | None = None

    # ----------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Everything calibration carries across steps (JSON-able): both windows, the counters,
        the held-back rng. The one-batch lookahead cache is not kept (a checkpoint falls between steps)."""
        return {
            "coverage_window": list(self.coverage_window),
            "risk_window": self.risk_window.state_dict(),
            "order_window": self.order_window.state_dict(),
            "rng": self.rng.bit_generator.state,
            "held_back_total": self.held_back_total,
            "coverage_hits": self.coverage_hits,
            "coverage_tests": self.coverage_tests,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        window = self.options.calibration_window
        self.coverage_window = deque((float(r) for r in state["coverage_window"]), maxlen=window)
        self.risk_window.load_state_dict(state["risk_window"])
        self.order_window.load_state_dict(state["order_window"])
        self.rng.bit_generator.state = state["rng"]
        self.held_back_total = int(state["held_back_total"])
        self.coverage_hits = int(state["coverage_hits"])
        self.coverage_tests = int(state["coverage_tests"])
        self._last = None

    # ------------------------------------------------------------------ pieces
    def gram(self, features: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if self.options.geometry == "identity":
            return torch.eye(len(rows), dtype=torch.float64)
        f = features[rows].to(torch.float64)
        return f @ f.T

    def group_set(self, scores: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(a) the centre and scale of the group's set from its two draws: m = (a(s1) + a(s2)) / 2,
        s = ||a(s1) - a(s2)|| + floor; the set is {c : ||c - m|| <= q s}."""
        eps, shape = self.options.eps, self.options.set_shape
        a1, a2 = sg.standardise(scores[rows, 0], eps), sg.standardise(scores[rows, 1], eps)
        return 0.5 * (a1 + a2), sg.set_norm(a1 - a2, shape) + self.options.disagreement_floor

    def fresh(self, scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The coefficients of the fresh reference: the mean of the draws after the first two
        (held-back groups only; one draw by default, the seed's setting)."""
        return sg.standardise(scores[rows, 2:self.grader_draws].mean(dim=1), self.options.eps)

    def quantile(self) -> float:
        return sg.conformal_quantile(list(self.coverage_window), self.options.alpha)

    def gate_statistic(self, a_hat: torch.Tensor, gram: torch.Tensor, q: float) -> tuple[sg.Recovery, float]:
        """The recovery of a group (point a_hat, set radius q) and its gating statistic rho (-inf
        when the reward-space worst projection is negative, the update is zero or has no scale in
        the geometry, or the recovery is infeasible)."""
        shape = self.options.set_shape
        rec = sg.recover(a_hat, gram, q, shape, anchor_only=self.options.recovery == "anchor_only")
        identity = torch.eye(len(a_hat), dtype=torch.float64)
        reward_space = sg.worst_projection(rec.coefficients, a_hat, identity, q, shape)
        # non-negative (direction-preserving, docs (b)) up to the bisection's tolerance: at eta* < 1
        # in the identity geometry the worst projection is 0 by construction
        # (a zero update is no update: never accepted, and never a record that cannot reverse)
        tolerance = 1e-9 * float(a_hat @ a_hat)  # the bisection's, in reward space
        size = float(rec.coefficients.norm())  # 0 iff the update is exactly zero (zero_update_tol = 0: that test only)
        if (not rec.feasible or size == 0 or size <= self.options.zero_update_tol * float(a_hat.norm())
                or reward_space < -tolerance):
            return rec, -math.inf
        # A feasible recovery has f(eta*) >= 0 up to the bisection's tolerance: rho >= 0 exactly, so
        # the grid's threshold 0 accepts every feasible group.
        rho = sg.normalised_projection(rec.coefficients, a_hat, gram, q, shape)
        return rec, max(rho, 0.0) if math.isfinite(rho) else -math.inf

    def goes_to_risk(self, index: int) -> bool:
        """Whether the index-th held-back group (of the run) joins the risk window: a fixed pattern
        with a `risk_share` of them, independent of any score."""
        share = self.options.risk_share
        return math.floor((index + 1) * share) > math.floor(index * share)

    def risk_records(self, q: float) -> list[tuple[float, bool]]:
        """(rho, reversed) of every risk group at the set radius q (x its scale): reversed when its
        recovered update opposes the update of its fresh draw."""
        return self.risk_window.records(q, lambda group: self.record(group, q))

    def record(self, group: HeldBackGroup, q: float) -> tuple[float, bool]:
        """A held-back group's gate statistic at radius q and whether its recovered update reverses
        (opposes the update of its fresh reference coefficients)."""
        rec, rho = self.gate_statistic(group.centre, group.gram, q * group.scale)
        return rho, float(rec.coefficients @ group.gram @ group.target) < 0

    def threshold(self, q: float) -> sg.Threshold:
        """(c) tau_sel: fixed-sequence tests on the risk window, starting where the ordering split
        (the coverage groups, disjoint from the risk groups) predicts enough records to certify."""
        order = self.order_window.records(q, lambda group: self.record(group, q))
        start = sg.sequence_start(order, len(self.risk_window), self.options.beta, self.options.delta, self.grid)
        self._metrics["setgrpo/tau_start"] = start
        return sg.select_threshold(self.risk_records(q), self.options.beta, self.options.delta, self.grid, start)

    # -------------------------------------------------------------------- step
    def coefficients(self, inputs: UpdateInput) -> Coefficients:
        scores, features = inputs.grader_scores, (inputs.group_geometry or {}).get("features")
        needs_features = "group_geometry" in self.requires
        if scores is None or scores.shape[1] < self.grader_draws or (features is None and needs_features):
            raise ValueError(f"setgrpo needs {self.grader_draws} grader draws per rollout and the group geometry")
        # The same batch again (L2RR's lookahead builds it before the update does): same answer,
        # and the calibration windows see each held-back group once.
        fingerprint = hashlib.sha256(scores.detach().cpu().numpy().tobytes()
                                     + inputs.group_ids.detach().cpu().numpy().tobytes()).hexdigest()
        if self._last is not None and self._last[0] == fingerprint:
            return self._last[1]
        groups = [rows for rows in inputs.groups() if rows.numel()]
        held = self.choose_held_back(len(groups))
        advantages = inputs.advantages.to(torch.float64).clone()
        keep = torch.ones(inputs.size, dtype=torch.bool, device=inputs.keep.device)
        q_before = self.quantile()
        step_hits, step_tests = 0, 0
        for position in held:
            rows = groups[position]
            keep[rows] = False
            centre, scale = self.group_set(scores, rows)
            target = self.fresh(scores, rows)
            if not self.goes_to_risk(self.held_back_total):  # coverage: out-of-sample check, then add
                r = sg.nonconformity(target, centre, self.options.set_shape) / scale
                if math.isfinite(q_before):
                    step_tests += 1
                    step_hits += int(r <= q_before)
                self.coverage_window.append(r)
                if float(centre.abs().sum()) > 0:
                    self.order_window.append(HeldBackGroup(centre, scale, target, self.gram(features, rows)))
            elif float(centre.abs().sum()) > 0:  # a zero-variance group never trains: not a record
                self.risk_window.append(HeldBackGroup(centre, scale, target, self.gram(features, rows)))
            self.held_back_total += 1
        self.coverage_hits += step_hits
        self.coverage_tests += step_tests

        q = self.quantile()
        calibrated = (len(self.coverage_window) >= self.options.min_calibration
                      and len(self.risk_window) >= self.options.min_calibration and math.isfinite(q))
        threshold = self.threshold(q) if calibrated else sg.Threshold(math.inf, 0, 0)
        etas, norms, accepted, informative, gateable = [], [], 0, 0, 0
        held_set = set(held)
        for position, rows in enumerate(groups):
            if position in held_set:
                continue
            a_hat, scale = self.group_set(scores, rows)
            if float(a_hat.abs().sum()) == 0:  # a zero-variance group: no update either way (not kept,
                advantages[rows] = 0.0        # so a step with nothing accepted is skipped, not a zero step)
                keep[rows] = False
                continue
            informative += 1
            if not calibrated:
                advantages[rows] = a_hat
                continue
            gram = self.gram(features, rows)
            rec, rho = self.gate_statistic(a_hat, gram, q * scale)
            etas.append(rec.eta)
            gateable += int(math.isfinite(rho))
            if rho >= threshold.tau:
                accepted += 1
                advantages[rows] = rec.coefficients
                norms.append(float(rec.coefficients.norm()))
            elif self.options.rejected == "point":
                advantages[rows] = a_hat
            else:
                keep[rows] = False
        self._metrics = {
            "setgrpo/tau_start": self._metrics.get("setgrpo/tau_start", math.nan) if calibrated else math.nan,
            "setgrpo/calibrated": float(calibrated),
            "setgrpo/heldback_groups": float(len(held)),
            "setgrpo/accepted_ratio": accepted / informative if calibrated and informative else math.nan,
            "setgrpo/recovery_mean": float(np.mean(etas)) if etas else math.nan,
            # groups with a finite gate statistic (feasible recovery, positive reward-space projection):
            # the only ones any threshold can accept
            "setgrpo/gateable_ratio": gateable / informative if calibrated and informative else math.nan,
            "setgrpo/risk_gateable": float(sum(math.isfinite(rho) for rho, _ in self.risk_records(q)))
            if calibrated else math.nan,
            "setgrpo/coef_norm": float(np.mean(norms)) if norms else math.nan,
            "setgrpo/coverage_step": step_hits / step_tests if step_tests else math.nan,
            "setgrpo/coverage": self.coverage_hits / self.coverage_tests if self.coverage_tests else math.nan,
            "setgrpo/quantile": q,
            "setgrpo/tau_sel": threshold.tau,
            "setgrpo/risk_calibration_ecr": threshold.empirical_risk,
            "setgrpo/risk_window": float(len(self.risk_window)),
            "setgrpo/risk_accepted": float(threshold.accepted),
        }
        out = Coefficients(advantages=advantages.to(inputs.advantages.dtype), keep=keep)
        self._last = (fingerprint, out)
        return out

    def choose_held_back(self, groups: int) -> list[int]:
        """Positions of the groups held back this step: a seeded ceil(fraction * G), >= 1 (none
        from a batch of one group: it would leave nothing to train)."""
        if groups < 2:
            return []
        count = min(groups - 1, max(1, math.ceil(self.options.calibration_fraction * groups)))
        return sorted(int(i) for i in self.rng.choice(groups, size=count, replace=False))

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)
