"""SetGRPO's `zero_update_tol` (docs/SETGRPO.md, "The gate question"): with a zero safe anchor the
recovery's bisection can end at a vanishing eta* (f(eta) = eta f'(0) < 0 stays within its
tolerance for tiny eta), an update of 1e-7 to 1e-9 of the point one, that the exact zero test keeps as
gateable; the option counts it as no update. The default (0) keeps the exact test."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_node.grpo import setgrpo as sg
from trainer_node.grpo.update_rules.setgrpo import SetGrpo, SetGrpoOptions


def _vanishing_case() -> tuple[torch.Tensor, torch.Tensor, float]:
    a_hat = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    return a_hat, torch.eye(8, dtype=torch.float64), 1.01  # radius > max |a_hat|: the box holds the origin


def test_a_zero_anchor_can_end_the_bisection_at_a_vanishing_update():
    a_hat, gram, radius = _vanishing_case()
    assert float(sg.safe_anchor(a_hat, radius, "box").abs().max()) == 0.0
    rec = sg.recover(a_hat, gram, radius, "box")
    assert 0 < rec.eta < 1e-6 and float(rec.coefficients.norm()) < 1e-6 * float(a_hat.norm())


def test_the_default_keeps_it_gateable_and_a_tolerance_does_not():
    a_hat, gram, radius = _vanishing_case()
    _, rho = SetGrpo(SetGrpoOptions()).gate_statistic(a_hat, gram, radius)
    assert rho == 0.0  # the default: exactly the test before the option
    _, rho = SetGrpo(SetGrpoOptions(zero_update_tol=1e-6)).gate_statistic(a_hat, gram, radius)
    assert rho == -math.inf


def test_a_real_recovery_is_untouched_by_the_tolerance():
    a_hat = torch.tensor([2.0, -1.0, 0.5, -1.5], dtype=torch.float64)
    gram = torch.eye(4, dtype=torch.float64)
    plain = SetGrpo(SetGrpoOptions()).gate_statistic(a_hat, gram, 0.3)
    tolerant = SetGrpo(SetGrpoOptions(zero_update_tol=1e-6)).gate_statistic(a_hat, gram, 0.3)
    assert plain[1] == tolerant[1] and math.isfinite(plain[1])
    assert torch.equal(plain[0].coefficients, tolerant[0].coefficients)


def test_the_option_is_typed():
    with pytest.raises(ValueError):
        SetGrpoOptions(zero_update_tol=-1.0)
