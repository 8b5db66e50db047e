"""SetGRPO (b), geometry-guided safe recovery: the recovered coefficients keep the update's
direction against every member of the joint set, and eta* is the largest ratio that does."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from trainer_node.grpo import setgrpo as sg


def _case(seed: int, k: int = 5, dim: int = 4):
    rng = np.random.default_rng(seed)
    a_hat = sg.standardise(torch.tensor(rng.random(k)))
    j = torch.tensor(rng.standard_normal((k, dim)))
    return a_hat, j @ j.T, float(rng.uniform(0.05, 0.8))


def _box_vertices(a_hat: torch.Tensor, q: float) -> torch.Tensor:
    signs = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=len(a_hat))), dtype=torch.float64)
    return a_hat + q * signs


def test_recovered_update_never_opposes_a_member_of_the_set():
    feasible = [seed for seed in range(60) if sg.recover(*_case(seed), "box").feasible]
    assert len(feasible) >= 30  # an infeasible anchor is rejected, never applied
    for seed in feasible:
        _check_box_recovery(seed)


def _check_box_recovery(seed: int) -> None:
    a_hat, gram, q = _case(seed)
    rec = sg.recover(a_hat, gram, q, "box")
    # a linear function's minimum over the box is at a vertex: check all 2^K of them
    worst = min(float(rec.coefficients @ gram @ c) for c in _box_vertices(a_hat, q))
    assert worst >= -1e-7 * float(a_hat @ gram @ a_hat)
    assert worst == pytest.approx(sg.worst_projection(rec.coefficients, a_hat, gram, q, "box"), abs=1e-9)
    if rec.eta < 1.0:  # the largest safe ratio: a little more recovery reverses some member
        anchor = sg.safe_anchor(a_hat, q, "box")
        beyond = anchor + min(rec.eta + 1e-3, 1.0) * (a_hat - anchor)
        assert sg.worst_projection(beyond, a_hat, gram, q, "box") < 0


def test_sphere_set_recovery_is_safe_against_sampled_members():
    checked = 0
    for seed in range(30):
        a_hat, gram, q = _case(seed)
        rec = sg.recover(a_hat, gram, q, "sphere")
        if not rec.feasible:
            continue
        checked += 1
        rng = np.random.default_rng(seed)
        directions = torch.tensor(rng.standard_normal((500, len(a_hat))))
        members = a_hat + q * directions / directions.norm(dim=1, keepdim=True)
        assert float((members @ gram @ rec.coefficients).min()) >= -1e-7 * float(a_hat @ gram @ a_hat)
    assert checked >= 10


def test_a_tight_set_recovers_fully_and_a_wide_one_falls_back_to_the_anchor():
    a_hat, gram, _ = _case(3)
    assert sg.recover(a_hat, gram, 0.0, "box").eta == 1.0
    wide = sg.recover(a_hat, gram, 10.0, "box")
    assert wide.eta < 1.0 and torch.equal(sg.safe_anchor(a_hat, 10.0, "box"), torch.zeros_like(a_hat))


def test_anchor_only_and_identity_geometry_ablations():
    a_hat, gram, q = _case(4)
    only = sg.recover(a_hat, gram, q, "box", anchor_only=True)
    assert only.eta == 0.0 and torch.allclose(only.coefficients, sg.safe_anchor(a_hat, q, "box"))
    identity = torch.eye(len(a_hat), dtype=torch.float64)
    rec = sg.recover(a_hat, identity, q, "box")
    assert rec.feasible  # the box anchor is sign-robust: always safe in reward space
    assert sg.worst_projection(rec.coefficients, a_hat, identity, q, "box") >= -1e-9


def test_the_box_anchor_has_every_members_sign():
    a_hat = torch.tensor([1.2, -0.3, -0.9], dtype=torch.float64)
    anchor = sg.safe_anchor(a_hat, 0.5, "box")
    assert torch.allclose(anchor, torch.tensor([0.7, 0.0, -0.4], dtype=torch.float64))
