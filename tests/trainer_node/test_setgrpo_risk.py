"""SetGRPO (c), selective risk-gated optimisation: the threshold picked on calibration records by
fixed-sequence testing keeps the conditional direction-reversal risk of accepted updates below
beta (seed: 0.08), with probability >= 1 - delta over the calibration draw, also when the
sequence's start is chosen on an independent ordering split."""

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
    assert sg.binomial_cdf(4, 3, 0.2) == 1.0  # more failures than trials: certain, not a math domain error
    assert sg.sequence_start([(0.5, True)], 1, 0.08, 0.1, [0.0, 0.5]) == pytest.approx(0.5)


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
    chosen = sg.select_threshold(records, 0.08, 0.1, GRID, start=0.8)
    assert chosen.tau == pytest.approx(0.2) and chosen.accepted == 60 and chosen.reversals == 0


def test_the_sequence_stops_at_the_first_threshold_not_certified():
    # tau 0.9 holds too few records to certify: fixed-sequence testing stops there, even though
    # the thresholds below it would pass (the price of testing each at the full level delta)
    records = [(0.95, False)] * 5 + [(0.5, False)] * 100
    assert sg.select_threshold(records, 0.08, 0.1, GRID).tau == math.inf
    assert sg.select_threshold(records, 0.08, 0.1, GRID, start=0.5).tau == pytest.approx(0.0)


def test_certificate_size_is_the_zero_reversal_bound():
    for beta, delta in [(0.08, 0.2), (0.08, 0.1), (0.05, 0.1)]:
        n = sg.certificate_size(beta, delta)
        assert (1 - beta) ** n <= delta < (1 - beta) ** (n - 1)
    assert sg.certificate_size(0.08, 0.2) == 20  # Bonferroni over 5 thresholds needed 39


def test_fixed_sequence_certifies_where_bonferroni_over_the_grid_could_not():
    records = [(0.6, False)] * 25  # 25 accepted, no reversal: 0.92^25 = 0.124 <= 0.2, > 0.2 / 5
    chosen = sg.select_threshold(records, 0.08, 0.2, [0.0, 0.2, 0.4, 0.6], start=0.6)
    assert chosen.tau == pytest.approx(0.0) and chosen.accepted == 25


def test_sequence_start_is_where_the_ordering_split_predicts_the_smallest_p_value():
    grid = [0.0, 0.5, 0.9]
    # no reversal anywhere: the larger the count the smaller the p-value, so the lowest tau
    clean = [(0.95, False)] * 10 + [(0.5, False)] * 40 + [(0.0, False)] * 50
    assert sg.sequence_start(clean, 400, 0.08, 0.1, grid) == pytest.approx(0.0)
    # reversals only below 0.5: the start skips the risky bottom and the thin top
    layered = [(0.95, False)] * 5 + [(0.5, False)] * 60 + [(0.0, True)] * 35
    assert sg.sequence_start(layered, 100, 0.08, 0.1, grid) == pytest.approx(0.5)
    # a tie (every p-value is 1: too few records) goes to the most conservative
    assert sg.sequence_start([(0.95, False)], 1, 0.08, 0.1, grid) == pytest.approx(0.9)
    assert sg.sequence_start([], 100, 0.08, 0.1, grid) == pytest.approx(0.0)


@pytest.mark.parametrize("beta,n,power", [(0.08, 1000, 0.9), (0.08, 150, 0.25), (0.05, 300, 0.25)])
def test_risk_is_controlled_with_the_start_chosen_on_an_independent_split(beta, n, power):
    """The ordering split (SetGRPO's coverage groups) and the test split (its risk groups) are
    disjoint draws from the same law; the start depends only on the ordering split."""
    delta, trials = 0.1, 400
    rng = np.random.default_rng(11)
    violations, accepted_any = 0, 0
    for _ in range(trials):
        start = sg.sequence_start(_records(rng, n), n, beta, delta, GRID)
        chosen = sg.select_threshold(_records(rng, n), beta, delta, GRID, start)
        if math.isfinite(chosen.tau):
            accepted_any += 1
            violations += _true_risk(chosen.tau) > beta
    assert violations / trials <= delta
    assert accepted_any / trials > power  # not vacuous: a threshold is often certified (measured: 1.0, 0.40, 0.42)
