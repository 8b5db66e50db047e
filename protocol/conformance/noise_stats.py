"""Statistics of the noise checks: is the spread of R repeated releases consistent with the
declared noise std?

Model of one released value: X = clamp(Y + Z, 0, 1), Z ~ N(0, sigma^2) the DP noise and
Y >= 0 the subsample's score sum divided by the public expected size (random too: every
release draws a fresh Poisson subsample).

Lower bound. Without clamping, Var(X) = Var(Y) + sigma^2 >= sigma^2 and the textbook bound is
(R-1) s^2 / sigma^2 ~ chi^2_{R-1}. Clamping breaks that: near 0 or 1 it cuts the noise off
(a checkpoint scoring 0 everywhere releases max(0, Z), whose variance is only 0.34 sigma^2).
So the threshold is the alpha-quantile of the sample std of clamp(mu + sigma Z) minimised
over mu in [0, 1], found by seeded Monte Carlo. It is exact when Y is constant (e.g. a
checkpoint that scores 0 on every row, the usual case for the suite's random model) and
conservative otherwise, because a random Y only adds spread.

Upper bound (loose). Clamping is 1-Lipschitz, so Var(X) <= Var(Y + Z) = Var(Y) + sigma^2,
and with per-row scores in [0, 1] and Poisson rate q, Var(Y) <= (1 - q) / (q N). The chi-square
upper quantile of that variance, times a slack of 1.5 for the non-normal Y, bounds s^2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

_SIMULATIONS = 50_000
_SEED = 7
UPPER_SLACK = 1.5


@dataclass(frozen=True)
class NoiseBounds:
    lower_std: float      # reject "noise present" when the sample std is below this
    upper_std: float      # reject "noise not excessive" when the sample std is above this


def lower_std_threshold(sigma: float, releases: int, alpha: float) -> float:
    """alpha-quantile of the sample std of `releases` draws of clamp(mu + sigma Z, 0, 1),
    minimised over mu in [0, 1] (see the module docstring)."""
    if sigma <= 0:
        return 0.0
    rng = np.random.default_rng(_SEED)
    z = rng.standard_normal((_SIMULATIONS, releases))
    # The minimum sits at a boundary (most clamping); a grid near both ends and the middle
    # covers every shape of the curve, also when sigma is large enough to clamp at both ends.
    offsets = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 3.0]) * sigma
    grid = np.unique(np.clip(np.concatenate([offsets, 1.0 - offsets, [0.5]]), 0.0, 1.0))
    quantiles = []
    for mu in grid:
        sample_std = np.clip(mu + sigma * z, 0.0, 1.0).std(axis=1, ddof=1)
        quantiles.append(float(np.quantile(sample_std, alpha)))
    return min(quantiles)


def upper_std_threshold(sigma: float, sample_rate: float, heldout_size: int, releases: int, alpha: float) -> float:
    """Loose (1 - alpha) upper bound on the sample std (see the module docstring)."""
    sampling_variance = (1.0 - sample_rate) / (sample_rate * heldout_size)
    chi2_upper = stats.chi2.ppf(1.0 - alpha, releases - 1) / (releases - 1)
    return float(np.sqrt((sigma**2 + sampling_variance) * chi2_upper * UPPER_SLACK))


def bounds(sigma: float, sample_rate: float, heldout_size: int, releases: int, alpha: float) -> NoiseBounds:
    return NoiseBounds(
        lower_std_threshold(sigma, releases, alpha),
        upper_std_threshold(sigma, sample_rate, heldout_size, releases, alpha),
    )


def known_mean_variance_interval(releases: int, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - alpha) interval of mean(x^2) / sigma^2 for `releases` draws of N(0, sigma^2):
    sum(x^2) / sigma^2 ~ chi^2 with `releases` degrees of freedom (the mean is known to be 0, so no
    degree is spent estimating it). A value outside it has probability alpha under the declared sigma."""
    lower = stats.chi2.ppf(alpha / 2, releases) / releases
    upper = stats.chi2.ppf(1.0 - alpha / 2, releases) / releases
    return float(lower), float(upper)
