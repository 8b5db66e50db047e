"""Statistics of the timing check: does an owner's latency track its released values?

Set-up (checks/shape.py): a checkpoint that scores 1 on most rows, so each DP release is a noisy
estimate of how many rows the SECRET subsample holds. If the owner's work grows with the
subsample, latency and released value are positively correlated; if its work is fixed, latency
is independent of the value (whatever the machine's load does to the latency).

The test: Pearson r between the K released values and the K latencies, |r| < threshold.
Under independence, if one of the two variables is i.i.d. normal (the released values are a
binomial count plus Gaussian noise: close to normal), r * sqrt((K-2) / (1-r^2)) follows
Student's t with K-2 degrees of freedom exactly, whatever the distribution of the other
variable, spikes and drifts included. So the threshold is the two-sided alpha quantile of that
law, and alpha is the check's false-failure rate on a server with fixed work, however noisy
the machine.

The same holds for ANY function of the latencies alone, so the latencies are first made
steadier, for power: log latency minus its rolling median over DRIFT_WINDOW neighbouring calls
(removes the slow drift of a shared machine's load), then clipped to median +- SPIKE_MADS
robust standard deviations (one scheduler spike cannot drown a real correlation).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

SPIKE_MADS = 5.0
DRIFT_WINDOW = 7


def correlation_threshold(calls: int, alpha: float) -> float:
    """|r| at or above which independence is rejected at two-sided level alpha, for `calls` pairs."""
    if calls < 4:
        raise ValueError(f"a correlation test needs at least 4 calls, got {calls}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    t = float(stats.t.ppf(1.0 - alpha / 2.0, calls - 2))
    return t / math.sqrt(calls - 2 + t * t)


def damp_spikes(latencies: np.ndarray) -> np.ndarray:
    """Values clipped to median +- SPIKE_MADS robust standard deviations (1.4826 MAD), along the last axis."""
    x = np.asarray(latencies, dtype=np.float64)
    median = np.median(x, axis=-1, keepdims=True)
    spread = 1.4826 * np.median(np.abs(x - median), axis=-1, keepdims=True)
    return np.where(spread > 0, np.clip(x, median - SPIKE_MADS * spread, median + SPIKE_MADS * spread), x)


def without_drift(latencies: np.ndarray, window: int = DRIFT_WINDOW) -> np.ndarray:
    """log latency minus its rolling median over `window` calls centred on each (shorter at the
    ends), along the last axis."""
    x = np.log(np.maximum(np.asarray(latencies, dtype=np.float64), 1e-9))
    half = window // 2
    count = x.shape[-1]
    medians = np.stack([np.median(x[..., max(0, i - half):i + half + 1], axis=-1) for i in range(count)], axis=-1)
    return x - medians


def steady_latencies(latencies: np.ndarray) -> np.ndarray:
    """What the latency check correlates: drift removed, spikes damped (a function of latencies only)."""
    return damp_spikes(without_drift(latencies))


def latency_correlation(values: np.ndarray, latencies: np.ndarray) -> float:
    """Pearson r of the released values with the steadied latencies (nan when either is constant)."""
    x = np.asarray(values, dtype=np.float64)
    y = steady_latencies(latencies)
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])
