"""Privacy events: what was released, described well enough to account for it.

An event is a frozen value object, like google dp_accounting's `PoissonSampledDpEvent(
GaussianDpEvent)`: accountants compose events, and the ledger stores them as JSON, so an
event must be exactly reconstructible from its fields.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SampledGaussianEvent:
    """`count` releases of a Poisson-subsampled Gaussian mechanism.

    noise_multiplier: std of the Gaussian noise divided by the L2 sensitivity of the
        released vector (for k candidates on one subsample, see
        `mechanisms.effective_noise_multiplier`).
    sample_rate: probability q that each held-out prompt is in a release's secret
        subsample; 1.0 means no subsampling (every prompt, every time).
    count: how many identical releases this event stands for.
    """

    noise_multiplier: float
    sample_rate: float
    count: int = 1

    def __post_init__(self) -> None:
        # Reject bools explicitly: True would otherwise pass as 1 / 1.0.
        if isinstance(self.noise_multiplier, bool) or not isinstance(self.noise_multiplier, (int, float)):
            raise TypeError(f"noise_multiplier must be a number, got {type(self.noise_multiplier).__name__}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"noise_multiplier must be finite and > 0, got {self.noise_multiplier!r}")
        if isinstance(self.sample_rate, bool) or not isinstance(self.sample_rate, (int, float)):
            raise TypeError(f"sample_rate must be a number, got {type(self.sample_rate).__name__}")
        if not (0.0 < self.sample_rate <= 1.0):
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int):
            raise TypeError(f"count must be an int, got {type(self.count).__name__}")
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count!r}")
        # Normalise to float so that equality and JSON round trips are exact.
        object.__setattr__(self, "noise_multiplier", float(self.noise_multiplier))
        object.__setattr__(self, "sample_rate", float(self.sample_rate))

    def repeated(self, times: int) -> SampledGaussianEvent:
        """The same release made `times` times as often."""
        return SampledGaussianEvent(self.noise_multiplier, self.sample_rate, self.count * times)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> SampledGaussianEvent:
        """Rebuild an event from `to_dict` output; errors name the offending field."""
        if not isinstance(data, dict):
            raise TypeError(f"event must be a JSON object, got {type(data).__name__}")
        expected = {"noise_multiplier", "sample_rate", "count"}
        unknown = set(data) - expected
        if unknown:
            raise ValueError(f"event has unknown fields: {sorted(unknown)}")
        missing = {"noise_multiplier", "sample_rate"} - set(data)
        if missing:
            raise ValueError(f"event is missing fields: {sorted(missing)}")
        return cls(data["noise_multiplier"], data["sample_rate"], data.get("count", 1))
