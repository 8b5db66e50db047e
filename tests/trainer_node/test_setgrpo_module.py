"""SetGRPO as the advantage stage's coefficient module: selected by `grpo.coefficients`, held-back
groups out of the update, ablations as options, positive-affine invariance (seed 002 Table 7),
and a short CPU training run with a noisy grader."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from tests.trainer_node.setgrpo_groups import make_input, noisy_groups
from trainer_node.grpo.settings import GRPOSettings
from trainer_node.grpo.update_seam import UpdateSeams, build_rule

FAST = {"name": "setgrpo", "min_calibration": 8, "alpha": 0.2, "calibration_fraction": 0.5, "beta": 0.3,
        "delta": 0.3, "thresholds": 4}


def _run(options: dict, steps: int, transform=lambda s: s, seed: int = 1):
    """Feed the same sequence of noisy batches to a fresh module; return each step's output."""
    rule = build_rule("coefficients", options)
    rng = np.random.default_rng(seed)
    outputs = []
    for step in range(steps):
        groups = noisy_groups(rng, 8, flip=0.05)
        inputs = make_input([[[transform(x) for x in row] for row in g] for g in groups], seed=step)
        outputs.append((rule.coefficients(inputs), rule.metrics()))
    return outputs


def test_held_back_groups_are_not_kept_and_every_group_is_accounted_for():
    out, metrics = _run(FAST, 1)[0]
    assert metrics["setgrpo/heldback_groups"] == 4.0 and metrics["setgrpo/calibrated"] == 0.0
    kept_groups = {int(g) for g in torch.tensor([i // 6 for i in range(48)])[out.keep]}
    assert len(kept_groups) <= 4  # 8 groups: 4 held back for calibration, the others train (unless ties)


def test_after_calibration_it_gates_and_logs_the_seeds_diagnostics():
    outputs = _run(FAST, 20)
    metrics = outputs[-1][1]
    assert metrics["setgrpo/calibrated"] == 1.0
    for key in ("setgrpo/accepted_ratio", "setgrpo/recovery_mean", "setgrpo/coverage", "setgrpo/quantile",
                "setgrpo/tau_sel"):
        assert key in metrics
    assert 0.0 <= metrics["setgrpo/coverage"] <= 1.0 and math.isfinite(metrics["setgrpo/quantile"])
    accepted = [m["setgrpo/accepted_ratio"] for _, m in outputs if m["setgrpo/calibrated"]]
    assert any(a > 0 for a in accepted)
    # only groups with a finite gate statistic can be accepted
    assert all(m["setgrpo/gateable_ratio"] >= m["setgrpo/accepted_ratio"] for _, m in outputs if m["setgrpo/calibrated"])
    assert all(m["setgrpo/risk_gateable"] <= m["setgrpo/risk_window"] for _, m in outputs if m["setgrpo/calibrated"])


@pytest.mark.parametrize("a,b", [(0.5, -1.0), (1.0, 0.0), (2.0, 1.0), (3.0, -2.0)])
@pytest.mark.parametrize("ablation", [{}, {"set_shape": "sphere"}, {"geometry": "identity"},
                                      {"recovery": "anchor_only"}])
def test_positive_affine_rewards_leave_coefficients_updates_and_decisions_unchanged(a, b, ablation):
    options = {**FAST, **ablation}
    base = _run(options, 12)
    moved = _run(options, 12, transform=lambda s: a * s + b)
    for (out0, m0), (out1, m1) in zip(base, moved):
        assert torch.equal(out0.keep, out1.keep)  # decisions: no flip
        assert torch.allclose(out0.advantages, out1.advantages, atol=1e-4)
        for key in ("setgrpo/recovery_mean", "setgrpo/tau_sel", "setgrpo/accepted_ratio"):
            assert m0[key] == pytest.approx(m1[key], abs=1e-4, nan_ok=True)


def test_the_same_batch_twice_is_one_calibration_step():
    rule = build_rule("coefficients", FAST)
    inputs = make_input(noisy_groups(np.random.default_rng(0), 8))
    first = rule.coefficients(inputs)
    again = rule.coefficients(inputs)  # L2RR's lookahead, then the update
    assert again is first and rule.held_back_total == 4


def test_bad_options_name_the_field():
    with pytest.raises(ValidationError, match=r"coefficients\.bta[\s\S]*did you mean 'beta'"):
        GRPOSettings(coefficients={"name": "setgrpo", "bta": 0.1})
    with pytest.raises(ValidationError, match=r"coefficients\.set_shape"):
        GRPOSettings(coefficients={"name": "setgrpo", "set_shape": "cube"})
    with pytest.raises(ValidationError, match=r"coefficients\.beta"):
        GRPOSettings(coefficients={"name": "setgrpo", "beta": 1.5})
    with pytest.raises(ValidationError, match=r"coefficients\.name[\s\S]*unknown coefficient module"):
        GRPOSettings(coefficients={"name": "setgrp"})


def test_the_seam_applies_coefficients_before_the_selection_mask():
    seams = UpdateSeams.from_settings(GRPOSettings(coefficients=FAST))
    assert seams.grader_draws == 3 and {"grader_scores", "group_geometry"} <= seams.requires
    inputs = make_input(noisy_groups(np.random.default_rng(2), 8))
    after = seams.advantages(inputs)
    factor = seams.token_factor(after)
    assert torch.equal((factor.sum(dim=1) > 0), after.keep)
    assert "setgrpo/recovery_s" in seams.metrics()
    identity = UpdateSeams.from_settings(GRPOSettings(coefficients={**FAST, "geometry": "identity"}))
    assert "group_geometry" not in identity.requires  # G = I: no geometry pass
    from dataclasses import replace

    assert identity.advantages(replace(inputs, group_geometry=None)).keep.shape == (inputs.size,)


def test_setgrpo_trains_a_tiny_policy_with_a_noisy_grader(tmp_path):
    from rlvr_core.verifiers.draws import draw_rng
    from tests.trainer_node.grpo_helpers import make_model_dir, make_settings, make_trainer

    def noisy(text, example, key, draws):
        base = sum(ch.isdigit() for ch in text) / max(len(text), 1)
        return tuple(min(1.0, max(0.0, base + 0.05 * float(draw_rng(key, d).standard_normal())))
                     for d in range(draws))

    options = {**FAST, "min_calibration": 2, "alpha": 0.4, "delta": 0.5, "beta": 0.5}
    trainer = make_trainer(make_model_dir(tmp_path), make_settings(coefficients=options), batch_size=6,
                           grader=noisy)
    records = [trainer.train_step() for _ in range(4)]
    assert all(r["rollouts_step"] == 24 for r in records)  # held-back groups' rollouts count
    assert all(r["setgrpo/heldback_groups"] == 3.0 for r in records)
    assert all(r["setgrpo/jacobian_s"] >= 0 and r["setgrpo/recovery_s"] >= 0 for r in records)
    assert all(0 < r["update/kept_frac"] <= 0.5 for r in records if not r["update_skipped"])


def test_reference_draws_ask_the_grader_for_more_and_average_them():
    rule = build_rule("coefficients", {**FAST, "reference_draws": 3})
    assert rule.grader_draws == 5 and UpdateSeams(coefficients=rule).grader_draws == 5
    three = make_input(noisy_groups(np.random.default_rng(0), 8, flip=0.05))
    with pytest.raises(ValueError, match="5 grader draws"):
        rule.coefficients(three)
    scores = torch.tensor([[1.0, 1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0, 0.0]])
    fresh = rule.fresh(scores, torch.arange(3))
    expected = torch.tensor([2 / 3, 1 / 3, 2 / 3], dtype=torch.float64)
    assert torch.allclose(fresh, (expected - expected.mean()) / (expected.std() + 1e-6))


def test_the_gate_statistic_rejects_a_zero_update_and_keeps_a_boundary_recovery():
    rule = build_rule("coefficients", {**FAST, "geometry": "identity"})
    a_hat = torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=torch.float64)
    identity = torch.eye(4, dtype=torch.float64)
    rec, rho = rule.gate_statistic(a_hat, identity, 5.0)  # the set holds the origin: the anchor is 0
    assert float(rec.coefficients.abs().sum()) == 0 and rho == -math.inf
    rec, rho = rule.gate_statistic(a_hat, identity, 1.2)  # eta* < 1: worst projection 0 at the boundary
    assert 0 < rec.eta < 1 and rho == 0.0  # direction-preserving (f >= 0), so a record the gate can accept
    singular = torch.zeros(4, 4, dtype=torch.float64)  # no geometry at all: no scale for rho
    assert build_rule("coefficients", FAST).gate_statistic(a_hat, singular, 0.8)[1] == -math.inf


def _closed_gate(rejected: str) -> list:
    """A calibrated module whose risk gate certifies no threshold (beta and delta too small for the
    window): every training group after calibration is a rejected one."""
    return _run({**FAST, "beta": 0.001, "delta": 0.001, "rejected": rejected}, 12)


def test_a_rejected_group_trains_on_its_point_coefficients_by_default():
    from trainer_node.grpo.update_rules.setgrpo import SetGrpoOptions

    assert SetGrpoOptions().rejected == "point"
    for out, metrics in _closed_gate("point")[-3:]:
        assert metrics["setgrpo/calibrated"] == 1.0 and metrics["setgrpo/accepted_ratio"] == 0.0
        assert metrics["setgrpo/tau_sel"] == math.inf
        # 8 groups of 6: the 4 held back are not kept, every informative training group is
        kept = {int(g) for g in torch.tensor([i // 6 for i in range(48)])[out.keep]}
        assert 1 <= len(kept) <= 4
        assert bool(out.advantages[out.keep].abs().sum() > 0)


def test_point_and_skip_differ_only_in_the_rejected_groups():
    point, skip = _closed_gate("point"), _closed_gate("skip")
    for (out_p, m_p), (out_s, m_s) in zip(point, skip):
        if m_p["setgrpo/calibrated"] == 0.0:  # before calibration: the same point coefficients, ungated
            assert torch.equal(out_p.keep, out_s.keep)
            assert torch.allclose(out_p.advantages, out_s.advantages)
            continue
        assert not bool(out_s.keep.any())  # nothing accepted: "skip" keeps no group, the step does nothing
        assert bool(out_p.keep.any())
        assert m_p["setgrpo/tau_sel"] == m_s["setgrpo/tau_sel"] == math.inf


def test_a_rejected_group_gets_exactly_m():
    rule = build_rule("coefficients", {**FAST, "beta": 0.001, "delta": 0.001})
    rng = np.random.default_rng(1)
    for step in range(12):
        inputs = make_input(noisy_groups(rng, 8, flip=0.05), seed=step)
        out = rule.coefficients(inputs)
    assert rule.metrics()["setgrpo/calibrated"] == 1.0
    checked = 0
    for rows in inputs.groups():
        if bool(out.keep[rows].all()):
            centre, _ = rule.group_set(inputs.grader_scores, rows)
            assert torch.allclose(out.advantages[rows].to(torch.float64), centre)
            checked += 1
    assert checked >= 1


def test_a_bad_rejected_option_names_the_field():
    with pytest.raises(ValidationError, match=r"coefficients\.rejected"):
        GRPOSettings(coefficients={"name": "setgrpo", "rejected": "drop"})
