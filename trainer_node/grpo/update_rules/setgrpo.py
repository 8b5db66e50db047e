"""setgrpo: Set-Valued GRPO for noisy graders (seed 002), the advantage stage's coefficient
module. Maths in trainer_node/grpo/setgrpo.py; derivations, the map to the seed and every
choice of ours in docs/SETGRPO.md.

Per step, over the batch's groups (grader draws s1, s2, s3 per rollout, the LM head geometry):
  1. each group's joint set is built from its two draws: centre m = (a(s1) + a(s2)) / 2 (the
     point coefficients), scale s = ||a(s1) - a(s2)|| + floor, set {c : ||c - m|| <= q s};
  2. a seeded ceil(calibration_fraction * G) groups are held back (not kept: they do not
     train; their rollouts are generated, so they count toward the rollouts of the RO ratio),
     alternately into the coverage and the risk calibration windows (independent calibrations);
     on them the third draw s3 is the fresh, exchangeable draw the set must cover;
  3. (a) q = the split-conformal (1 - alpha) quantile of ||a(s3) - m|| / s over the coverage window;
  4. (c) tau_sel from the risk window: a risk group's recovered coefficients are a direction
     reversal when their update opposes the update of a(s3);
  5. for each training group: (b) the recovered coefficients a(eta*); accepted when
     rho >= tau_sel and the reward-space projection is > 0, else not kept (no update).
Until both windows hold `min_calibration` groups the training groups get the point coefficients m
ungated (logged as setgrpo/calibrated = 0). Training groups read only s1 and s2.

Ablations (seed Table 5): set_shape = "sphere" (spherical set), geometry = "identity" (G = I),
recovery = "anchor_only" (eta = 0: the safe anchor).
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from typing import Literal

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
                                 "gates updates; before that, the point coefficients ungated. (At beta = 0.08, "
                                 "delta = 0.1 and 10 thresholds, one needs >= 56 accepted risk groups.)")
    thresholds: int = Field(default=10, ge=1, le=200, description="Candidate tau_sel values, evenly spaced on "
                            "[0, 0.9] (each tested at delta / thresholds).")
    set_shape: Literal["box", "sphere"] = Field(default="box", description="(a) the joint set: 'box' (sup "
                                                "norm, ours) or 'sphere' (the seed's spherical-set ablation).")
    geometry: Literal["policy", "identity"] = Field(default="policy", description="(b) 'policy': the LM "
                                                    "head Gram matrix; 'identity': G = I (ablation).")
    recovery: Literal["largest_safe", "anchor_only"] = Field(default="largest_safe", description="(b) "
                                                             "'anchor_only': eta = 0 always (ablation).")
    disagreement_floor: float = Field(default=0.5, gt=0.0, description="(a) s_g = ||a(s1) - a(s2)|| + this: "
                                      "the set's scale for a group whose two draws agree (coefficient units).")
    eps: float = Field(default=1e-6, gt=0.0, description="Added to each group's score std.")
    seed: int = Field(default=0, ge=0, description="Seeds the choice of held-back groups.")


@COEFFICIENTS.register("setgrpo", options=SetGrpoOptions)
class SetGrpo(CoefficientRule):
    options: SetGrpoOptions
    requires = frozenset({"grader_scores", "group_geometry"})
    grader_draws = 3  # two build each group's set; the third, on held-back groups only, is the fresh draw

    def __init__(self, options: SetGrpoOptions):
        super().__init__(options)
        if options.geometry == "identity":  # G = I needs no features: skip the geometry pass
            self.requires = frozenset({"grader_scores"})
        window = options.calibration_window
        self.coverage_window: deque[float] = deque(maxlen=window)      # nonconformities R
        self.risk_window: deque[tuple[float, bool]] = deque(maxlen=window)  # (rho, reversed)
        self.rng = np.random.default_rng(options.seed)
        self.held_back_total = 0
        self.coverage_hits = 0
        self.coverage_tests = 0
        self.grid = [0.9 * i / max(options.thresholds - 1, 1) for i in range(options.thresholds)]
        self._metrics: dict[str, float] = {}
        self._last: tuple[str, Coefficients] | None = None

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
        """The coefficients of the third, independent draw (held-back groups only)."""
        return sg.standardise(scores[rows, 2], self.options.eps)

    def quantile(self) -> float:
        return sg.conformal_quantile(list(self.coverage_window), self.options.alpha)

    def gate_statistic(self, a_hat: torch.Tensor, gram: torch.Tensor, q: float) -> tuple[sg.Recovery, float]:
        """The recovery of a group (point a_hat, set radius q) and its gating statistic rho (-inf
        when the reward-space projection is not positive or the recovery is infeasible)."""
        shape = self.options.set_shape
        rec = sg.recover(a_hat, gram, q, shape, anchor_only=self.options.recovery == "anchor_only")
        identity = torch.eye(len(a_hat), dtype=torch.float64)
        reward_space = sg.worst_projection(rec.coefficients, a_hat, identity, q, shape)
        if not rec.feasible or reward_space <= 0:
            return rec, -math.inf
        return rec, sg.normalised_projection(rec.coefficients, a_hat, gram, q, shape)

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
            if self.held_back_total % 2 == 0:  # coverage window: out-of-sample check, then add
                r = sg.nonconformity(target, centre, self.options.set_shape) / scale
                if math.isfinite(q_before):
                    step_tests += 1
                    step_hits += int(r <= q_before)
                self.coverage_window.append(r)
            elif math.isfinite(q_before) and float(centre.abs().sum()) > 0:
                gram = self.gram(features, rows)
                rec, rho = self.gate_statistic(centre, gram, q_before * scale)
                self.risk_window.append((rho, float(rec.coefficients @ gram @ target) < 0))
            self.held_back_total += 1
        self.coverage_hits += step_hits
        self.coverage_tests += step_tests

        q = self.quantile()
        calibrated = (len(self.coverage_window) >= self.options.min_calibration
                      and len(self.risk_window) >= self.options.min_calibration and math.isfinite(q))
        threshold = (sg.select_threshold(list(self.risk_window), self.options.beta, self.options.delta, self.grid)
                     if calibrated else sg.Threshold(math.inf, 0, 0))
        etas, norms, accepted, informative = [], [], 0, 0
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
            if rho >= threshold.tau:
                accepted += 1
                advantages[rows] = rec.coefficients
                norms.append(float(rec.coefficients.norm()))
            else:
                keep[rows] = False
        self._metrics = {
            "setgrpo/calibrated": float(calibrated),
            "setgrpo/heldback_groups": float(len(held)),
            "setgrpo/accepted_ratio": accepted / informative if calibrated and informative else math.nan,
            "setgrpo/recovery_mean": float(np.mean(etas)) if etas else math.nan,
            "setgrpo/coef_norm": float(np.mean(norms)) if norms else math.nan,
            "setgrpo/coverage_step": step_hits / step_tests if step_tests else math.nan,
            "setgrpo/coverage": self.coverage_hits / self.coverage_tests if self.coverage_tests else math.nan,
            "setgrpo/quantile": q,
            "setgrpo/tau_sel": threshold.tau,
            "setgrpo/risk_calibration_ecr": threshold.empirical_risk,
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
