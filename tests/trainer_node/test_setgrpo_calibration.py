"""SetGRPO (a), joint reward-set calibration: split-conformal coverage at the nominal level on
synthetic exchangeable data (seed 002: "finite-sample marginal coverage for the joint set")."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainer_node.grpo import setgrpo as sg


def test_the_quantile_is_the_conformal_rank_and_infinite_when_too_few():
    assert sg.conformal_quantile([3.0, 1.0, 2.0], 0.5) == 2.0      # ceil(4 * 0.5) = 2nd smallest
    assert sg.conformal_quantile([1.0] * 8, 0.1) == math.inf        # ceil(9 * 0.9) = 9 > 8
    assert sg.conformal_quantile([float(i) for i in range(9)], 0.1) == 8.0


@pytest.mark.parametrize("shape", sg.SET_SHAPES)
@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_joint_set_covers_a_fresh_draw_at_the_nominal_level(shape, alpha):
    """Coefficients of two exchangeable draws of the same K responses: the set around the first
    built from n calibration groups holds the second with probability >= 1 - alpha, and not much
    more (<= 1 - alpha + 1/(n+1) in expectation), averaged over many calibration draws."""
    rng = np.random.default_rng(11)
    k, n, trials, tests = 6, 99, 300, 20
    hits = []
    for _ in range(trials):
        def group() -> float:
            truth = rng.uniform(0, 1, k)
            s1, s2 = (torch.tensor(truth + 0.3 * rng.standard_normal(k)) for _ in range(2))
            return sg.nonconformity(sg.standardise(s1), sg.standardise(s2), shape)

        q = sg.conformal_quantile([group() for _ in range(n)], alpha)
        hits.extend(group() <= q for _ in range(tests))
    coverage = float(np.mean(hits))
    se = math.sqrt(alpha * (1 - alpha) / len(hits)) * 3  # calibration draws add variance: generous
    assert coverage >= 1 - alpha - se
    assert coverage <= 1 - alpha + 1 / (n + 1) + se


def test_the_set_is_joint_one_number_per_group():
    a1 = torch.tensor([1.0, -1.0, 0.5])
    a2 = torch.tensor([0.5, -1.5, 0.5])
    assert sg.nonconformity(a1, a2, "box") == pytest.approx(0.5)
    assert sg.nonconformity(a1, a2, "sphere") == pytest.approx(math.sqrt(0.5))


def test_standardise_is_grpo_and_zero_for_a_tie():
    assert torch.equal(sg.standardise(torch.tensor([1.0, 1.0, 1.0])), torch.zeros(3))
    a = sg.standardise(torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert float(a.sum()) == pytest.approx(0.0) and float(a.std()) == pytest.approx(1.0, rel=1e-5)
