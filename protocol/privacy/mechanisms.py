"""The release mechanism: a noisy mean of per-prompt scores. Pure functions; the
randomness is passed in as a `NoiseSource`, so tests can use a seeded stand-in.

Privacy model (see docs/PRIVACY.md):
- Neighbouring data sets differ by adding or removing ONE held-out prompt.
- Each prompt contributes a score in [0, 1] (mean of its k samples, clamped), so one
  candidate's SUM of scores has L2 sensitivity 1.
- k candidates evaluated on the SAME secret subsample form a vector of k sums. One prompt
  moves every coordinate by at most 1, so the vector has L2 sensitivity sqrt(k). With
  independent per-coordinate noise of std sigma, the Gaussian mechanism's noise
  multiplier is sigma / sqrt(k) (`effective_noise_multiplier`).
- The sum is divided by the PUBLIC expected subsample size q*N, never by the true size
  (which is data-dependent and would leak). Division and clamping are post-processing.
- A difference release sums per-prompt DIFFERENCES from a base, each clipped to the public
  [-c, c]: the same argument with sensitivity c per coordinate (c sqrt(k) for the vector), so
  noise of std z * c per coordinate gives the same noise multiplier z, and the same event.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import threading
from collections import Counter
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class NoiseSource(Protocol):
    """Where a mechanism gets its randomness from."""

    def normal(self, std: float, size: int) -> np.ndarray:
        """`size` independent draws from N(0, std^2), float64, shape (size,)."""
        ...

    def bernoulli_mask(self, n: int, p: float) -> np.ndarray:
        """Boolean mask of shape (n,), each entry True independently with probability p."""
        ...


def _check_std(std: float) -> None:
    if not (math.isfinite(std) and std >= 0):
        raise ValueError(f"std must be finite and >= 0, got {std!r}")


def _check_probability(p: float) -> None:
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"p must be in [0, 1], got {p!r}")


class SecureRandom:
    """Cryptographically secure noise from the OS (os.urandom via random.SystemRandom).

    A seeded PRNG would let anyone who learns the seed subtract the noise, so the owner
    must use this class for real releases. `normalvariate` is used rather than `gauss`
    because `gauss` caches its second Box-Muller draw on the instance, which two threads
    could both read (identical noise in two releases).
    """

    def __init__(self) -> None:
        self._rng = random.SystemRandom()

    def normal(self, std: float, size: int) -> np.ndarray:
        _check_std(std)
        return np.array([self._rng.normalvariate(0.0, std) for _ in range(size)], dtype=np.float64)

    def bernoulli_mask(self, n: int, p: float) -> np.ndarray:
        _check_probability(p)
        # 53 random bits per row -> a uniform double in [0, 1); u < 1.0 always, so p=1 keeps all.
        words = np.frombuffer(os.urandom(8 * n), dtype="<u8") >> np.uint64(11)
        return words.astype(np.float64) * (2.0**-53) < p

    # Aliases in the vocabulary of the random module / sampling literature.
    def gauss(self, mu: float, sigma: float) -> float:
        return mu + float(self.normal(sigma, 1)[0])

    def poisson_mask(self, n: int, rate: float) -> np.ndarray:
        return self.bernoulli_mask(n, rate)

    def for_release(self, key: str) -> SecureRandom:
        """The source one release draws from: this one (fresh OS randomness for every release)."""
        return self


class SeededRandom:
    """Reproducible, NOT secure noise (numpy PCG64). For tests and simulations only."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def normal(self, std: float, size: int) -> np.ndarray:
        _check_std(std)
        return self._rng.normal(0.0, std, size=size).astype(np.float64)

    def bernoulli_mask(self, n: int, p: float) -> np.ndarray:
        _check_probability(p)
        return self._rng.random(n) < p

    def gauss(self, mu: float, sigma: float) -> float:
        return mu + float(self.normal(sigma, 1)[0])

    def poisson_mask(self, n: int, rate: float) -> np.ndarray:
        return self.bernoulli_mask(n, rate)

    def for_release(self, key: str) -> SeededRandom:
        return self


class ContentSeededRandom:
    """Reproducible, NOT secure noise for a simulated owner: each release draws from a generator
    seeded by (seed, the request's content, how often that content was asked before).

    A shared seeded stream would hand out its draws in whatever order releases happen to be
    charged, which depends on timing; keyed by content, a release's subsample and noise are the
    same whenever it is asked. Anyone who knows the seed can subtract the noise: simulations only
    (`target-owner-node serve --insecure-noise-seed`).
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._asked: Counter[str] = Counter()
        self._lock = threading.Lock()

    def for_release(self, key: str) -> SeededRandom:
        with self._lock:
            occurrence = self._asked[key]
            self._asked[key] += 1
        digest = hashlib.sha256(f"{self.seed}:{key}:{occurrence}".encode()).digest()
        return SeededRandom(int.from_bytes(digest[:16], "little"))

    def normal(self, std: float, size: int) -> np.ndarray:
        return self.for_release("").normal(std, size)

    def bernoulli_mask(self, n: int, p: float) -> np.ndarray:
        return self.for_release("").bernoulli_mask(n, p)


def release_source(source: NoiseSource, key: str) -> NoiseSource:
    """The source one release with content `key` draws its subsample and noise from."""
    keyed = getattr(source, "for_release", None)  # a test's bare NoiseSource has none: it is used as is
    return keyed(key) if keyed is not None else source


def poisson_subsample(num_prompts: int, sample_rate: float, source: NoiseSource) -> np.ndarray:
    """Indices of a fresh Poisson subsample: each prompt kept independently with prob q.

    The subsample (and its size) is secret; draw a new one for every query, since the
    amplification-by-subsampling guarantee assumes fresh, independent sampling.
    """
    if num_prompts < 0:
        raise ValueError(f"num_prompts must be >= 0, got {num_prompts!r}")
    if not (0.0 < sample_rate <= 1.0):
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    return np.flatnonzero(source.bernoulli_mask(num_prompts, sample_rate))


def rows_per_query(num_prompts: int, sample_rate: float, tail: float) -> int:
    """The public number of rows every query evaluates: the smallest M with
    P(Binomial(N, q) > M) <= tail (M = N when q = 1).

    A query evaluates exactly M rows whatever its secret subsample size m, so its time and
    memory reveal nothing about m: the m sampled rows plus M - m rows whose scores are
    discarded. With probability at most `tail`, m > M and a uniformly random M of the
    sampled rows are kept (`cap_subsample`); that event adds at most `tail` to delta.
    """
    from scipy.stats import binom

    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts!r}")
    if not (0.0 < sample_rate <= 1.0):
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    if not (0.0 < tail < 1.0):
        raise ValueError(f"tail must be in (0, 1), got {tail!r}")
    if sample_rate == 1.0:
        return num_prompts
    return int(min(num_prompts, max(1, binom.isf(tail, num_prompts, sample_rate))))


def cap_subsample(indices: np.ndarray, cap: int, source: NoiseSource) -> np.ndarray:
    """At most `cap` of `indices`, a uniformly random subset when there are more (sorted).

    The ranking uses iid Gaussian draws from `source` (any continuous iid keys give a
    uniformly random order), so the owner's secure source decides which rows stay.
    """
    indices = np.asarray(indices)
    if cap < 0:
        raise ValueError(f"cap must be >= 0, got {cap!r}")
    if len(indices) <= cap:
        return indices
    keys = np.asarray(source.normal(1.0, len(indices)), dtype=np.float64)
    return np.sort(indices[np.argsort(keys, kind="stable")[:cap]])


def capped_poisson_mask(num_prompts: int, sample_rate: float, cap: int, source: NoiseSource) -> np.ndarray:
    """The subsample one DP query evaluates, as a boolean mask (N,): `poisson_subsample`, then
    `cap_subsample` to at most `cap` rows. Drawn once per query and stored with its charge."""
    mask = np.zeros(num_prompts, dtype=bool)
    mask[cap_subsample(poisson_subsample(num_prompts, sample_rate, source), cap, source)] = True
    return mask


def _check_scores(scores: np.ndarray) -> np.ndarray:
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2:
        raise ValueError(f"scores must have shape (candidates, prompts), got ndim={scores.ndim}")
    if scores.shape[0] < 1:
        raise ValueError("scores must hold at least one candidate")
    if not np.all(np.isfinite(scores)):
        # Reported without values: scores are per-example results and must not leak.
        raise ValueError("scores contain NaN or infinite entries")
    return scores


def _check_expected_size(expected_size: float) -> None:
    if not (math.isfinite(expected_size) and expected_size > 0):
        raise ValueError(f"expected_size must be finite and > 0, got {expected_size!r}")


def replay_release(scores: np.ndarray, expected_size: float, noise_draws: np.ndarray) -> np.ndarray:
    """The release `noisy_mean_release` made, recomputed from its stored noise draws.

    scores: (k, m) per-prompt scores; expected_size: public q*N; noise_draws: (k,).
    Returns (k,) released values in [0, 1].
    """
    return _noisy_means(scores, expected_size, noise_draws, 0.0, 1.0, (0.0, 1.0))


def replay_difference_release(
    differences: np.ndarray, expected_size: float, noise_draws: np.ndarray, clip: float
) -> np.ndarray:
    """A difference release (docs/PRIVACY.md, "Difference releases"), from its stored noise draws.

    differences: (k, m) per-prompt differences of k candidates from the base; each is clipped to
    the public [-clip, clip] here (the sensitivity bound depends on it), so one prompt moves each
    candidate's sum by at most clip, and the noise draws must be N(0, (z * clip)^2).
    Returns (k,) released mean differences, clamped to [-1, 1] (post-processing).
    """
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be finite and > 0, got {clip!r}")
    return _noisy_means(differences, expected_size, noise_draws, -clip, clip, (-1.0, 1.0))


def _noisy_means(values: np.ndarray, expected_size: float, noise_draws: np.ndarray, low: float, high: float,
                 output: tuple[float, float]) -> np.ndarray:
    """(sum over prompts of each row clipped to [low, high] + its noise draw) / expected_size, clamped."""
    values = _check_scores(values)
    _check_expected_size(expected_size)
    noise_draws = np.asarray(noise_draws, dtype=np.float64)
    if noise_draws.shape != (values.shape[0],):
        raise ValueError(f"noise_draws must have shape ({values.shape[0]},), got {noise_draws.shape}")
    if not np.all(np.isfinite(noise_draws)):
        raise ValueError("noise_draws contain NaN or infinite entries")
    sums = np.clip(values, low, high).sum(axis=1)  # (k,) sensitivity max(|low|, |high|) per coordinate
    return np.clip((sums + noise_draws) / expected_size, *output)


def gaussian_noise(noise_std_sum: float, num_candidates: int, source: NoiseSource) -> np.ndarray:
    """The noise of one release: `num_candidates` iid N(0, noise_std_sum^2) draws, one per
    candidate's sum. Drawn when the release is charged and stored with it, so a retry replays it."""
    _check_std(noise_std_sum)
    if num_candidates < 1:
        raise ValueError(f"num_candidates must be >= 1, got {num_candidates!r}")
    return np.asarray(source.normal(noise_std_sum, num_candidates), dtype=np.float64).reshape(num_candidates)


def noisy_mean_release(
    scores: np.ndarray, expected_size: float, noise_std_sum: float, source: NoiseSource
) -> tuple[np.ndarray, np.ndarray]:
    """Release k noisy mean scores computed on one secret subsample.

    scores: (k, m) — k candidates x m sampled prompts, each score meant to be in [0, 1]
        (clamped here anyway, since the sensitivity bound depends on it).
    expected_size: the PUBLIC denominator q*N (never the true m).
    noise_std_sum: std of the Gaussian noise added to each candidate's sum
        (0 disables noise: no DP).
    Returns (released (k,), noise_draws (k,)). The owner stores the draws privately so a
    retried request replays the identical release (`replay_release`) at no privacy cost.
    """
    scores = _check_scores(scores)
    _check_expected_size(expected_size)
    _check_std(noise_std_sum)
    noise_draws = gaussian_noise(noise_std_sum, scores.shape[0], source)
    return replay_release(scores, expected_size, noise_draws), noise_draws


def effective_noise_multiplier(noise_std_sum: float, num_candidates: int) -> float:
    """Noise multiplier of one k-candidate release: sigma / sqrt(k).

    The vector of k sums has L2 sensitivity sqrt(k) under add/remove-one-prompt.
    """
    if num_candidates < 1:
        raise ValueError(f"num_candidates must be >= 1, got {num_candidates!r}")
    _check_std(noise_std_sum)
    return noise_std_sum / math.sqrt(num_candidates)


def noise_std_for_multiplier(noise_multiplier: float, num_candidates: int) -> float:
    """Per-candidate noise std on the sum that gives a k-candidate release the noise
    multiplier z (inverse of `effective_noise_multiplier`): z * sqrt(k)."""
    if num_candidates < 1:
        raise ValueError(f"num_candidates must be >= 1, got {num_candidates!r}")
    _check_std(noise_multiplier)
    return noise_multiplier * math.sqrt(num_candidates)


def released_noise_std(noise_std_sum: float, expected_size: float) -> float:
    """Std of the noise on a released mean (before clamping): sigma / (q*N)."""
    _check_std(noise_std_sum)
    _check_expected_size(expected_size)
    return noise_std_sum / expected_size
