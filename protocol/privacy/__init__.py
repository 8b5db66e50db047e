"""Differential privacy for released accuracies: events (what was released), mechanisms
(how a release is computed, pure functions) and accountants (how much it cost).
See docs/PRIVACY.md for the guarantee."""

from protocol.privacy.accountants import (
    ACCOUNTANTS,
    Accountant,
    AccountingError,
    accountant_names,
    build_accountant,
    calibrate_noise_multiplier,
    releases_remaining,
)
from protocol.privacy.events import SampledGaussianEvent
from protocol.privacy.mechanisms import (
    NoiseSource,
    SecureRandom,
    SeededRandom,
    effective_noise_multiplier,
    noise_std_for_multiplier,
    noisy_mean_release,
    poisson_subsample,
    released_noise_std,
    replay_release,
)

__all__ = [
    "ACCOUNTANTS",
    "Accountant",
    "AccountingError",
    "NoiseSource",
    "SampledGaussianEvent",
    "SecureRandom",
    "SeededRandom",
    "accountant_names",
    "build_accountant",
    "calibrate_noise_multiplier",
    "effective_noise_multiplier",
    "noise_std_for_multiplier",
    "noisy_mean_release",
    "poisson_subsample",
    "released_noise_std",
    "releases_remaining",
    "replay_release",
]
