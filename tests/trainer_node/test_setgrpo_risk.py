"""SetGRPO (c), selective risk-gated optimisation: the threshold picked on calibration records
keeps the conditional direction-reversal risk of accepted updates below beta (seed: 0.08), with
probability >= 1 - delta over the calibration draw."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainer_node.grpo import setgrpo as sg

GRID = [0.9 * i / 9 for i in range(10)]


def _records(rng: np.random.Generator, n: int) -> list[tuple[float, bool]]:
    """rho ~ U(-0.2, 1); reversal probability falls with rho: 0.45 (1 - rho)^2, so low thresholds
    are risky and high ones safe."""
    rho = rng.uniform(-0.2, 1.0, n)
    return [(float(r), bool(rng.random() < 0.45 * (1 - r) ** 2)) for r in rho]


def _true_risk(tau: float) -> float:
    """E[0.45 (1 - rho)^2 | rho >= tau] for rho ~ U(-0.2, 1), in closed form."""
    lo = max(tau, -0.2)
    if lo >= 1.0:
        return 0.0
    return 0.45 * (1 - lo) ** 2 / 3


def test_binomial_cdf():
    assert sg.binomial_cdf(0, 10, 0.5) == pytest.approx(0.5 ** 10)
    assert sg.binomial_cdf(10, 10, 0.3) == pytest.approx(1.0)
    assert sg.binomial_cdf(1, 3, 0.2) == pytest.approx(0.8 ** 3 + 3 * 0.2 * 0.8 ** 2)


@pytest.mark.parametrize("beta", [0.08, 0.05])
def test_risk_of_accepted_updates_is_controlled_at_beta(beta):
    delta, trials = 0.1, 400
    rng = np.random.default_rng(5)
    violations, accepted_any = 0, 0
    for _ in range(trials):
        chosen = sg.select_threshold(_records(rng, 1000), beta, delta, GRID)
        if math.isfinite(chosen.tau):
            accepted_any += 1
            violations += _true_risk(chosen.tau) > beta
    assert violations / trials <= delta
    assert accepted_any / trials > 0.5  # and it is not vacuous: a threshold is usually certified


def test_no_threshold_when_every_candidate_is_too_risky():
    records = [(0.95, i % 3 == 0) for i in range(300)]  # 1/3 of even the best updates reverse
    assert sg.select_threshold(records, 0.08, 0.1, GRID).tau == math.inf


def test_the_loosest_certified_threshold_is_chosen():
    records = [(0.8, False)] * 60 + [(0.1, True)] * 60
    chosen = sg.select_threshold(records, 0.08, 0.1, GRID)
    assert chosen.tau == pytest.approx(0.2) and chosen.accepted == 60 and chosen.reversals == 0
