"""Noisy graders (issue 19): verifiers whose scores of one response are random, built on an
exact one, registered by name with typed options.

    noisy_flip          the base verifier's score, flipped (s -> 1 - s) with probability flip_rate
                        per draw: an exact verifier with calibrated flip noise
    stochastic_grader   the base score plus Gaussian noise (std noise_std), clamped to [0, 1]: a
                        rubric or model grader whose two draws disagree
    partial_checks      a random subset of the answer's checks (each kept with probability
                        check_fraction): seed 000's Table 11, a random 50% of the unit tests

Each draw's randomness is keyed by (seed, row key, sample index, draw index) only
(rlvr_core/verifiers/draws.py), so a replay scores the same and one row's draws never depend on
which other rows are scored (docs/PRIVACY.md). `score` (one score, no key) is draw 0 of sample 0
under seed 0: callers that know the sample use `score_draws`. The final test evaluation always
uses an exact verifier (`Verifier.noisy` is False).

Use one by name, e.g. a testbed's `source_grader = { name = "noisy_flip", flip_rate = 0.2 }`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rlvr_core.configuration import OptionsSection
from rlvr_core.tasks.example import Example
from rlvr_core.verifiers.base import VERIFIERS, Verifier, extract_answer, get_verifier
from rlvr_core.verifiers.draws import DrawKey, draw_rng
from rlvr_core.verifiers.exact_match import normalise


class _BaseOptions(OptionsSection):
    name: str
    base: str | None = Field(default=None, description="The exact verifier the noise is added to (a "
                             "registered verifier that is not itself noisy); None: each row's own verifier.")

    @field_validator("base")
    @classmethod
    def _exact_base(cls, base: str | None) -> str | None:
        if base is None:
            return None
        if base not in VERIFIERS:
            raise ValueError(f"unknown verifier {base!r}; known: {', '.join(VERIFIERS.names())}")
        if VERIFIERS.get(base).noisy:
            raise ValueError(f"verifier {base!r} is noisy itself; name an exact verifier, e.g. 'exact_match'")
        return base


class NoisyFlipOptions(_BaseOptions):
    name: Literal["noisy_flip"] = "noisy_flip"
    flip_rate: float = Field(default=0.2, ge=0.0, lt=0.5, description="Probability that a draw reports 1 - s "
                             "instead of the exact score s (< 0.5: the grader stays informative).")


class StochasticGraderOptions(_BaseOptions):
    name: Literal["stochastic_grader"] = "stochastic_grader"
    noise_std: float = Field(default=0.3, ge=0.0, le=2.0, description="Std of the Gaussian noise added to "
                             "the exact score before clamping to [0, 1].")


class PartialChecksOptions(OptionsSection):
    name: Literal["partial_checks"] = "partial_checks"
    check_fraction: float = Field(default=0.5, gt=0.0, le=1.0, description="Probability that each check "
                                  "(one per answer character, plus the length) is run in a draw; at least one "
                                  "check always runs. 1 = exact match.")


class _NoisyBase(Verifier):
    noisy = True

    def score(self, completion: str, example: Example) -> float:
        return self.score_draws(completion, example, DrawKey.of(0, example.id, 0), 1)[0]

    def exact(self, example: Example) -> Verifier:
        """The exact verifier under the noise: `base`, or the row's own verifier."""
        name = getattr(self.options, "base", None) or example.verifier
        verifier = get_verifier(name)
        if verifier.noisy:
            raise ValueError(f"{self.name}: the row's verifier {name!r} is noisy itself; set `base`")
        return verifier

    def check_example(self, example: Example) -> None:
        self.exact(example).check_example(example)


@VERIFIERS.register("noisy_flip", options=NoisyFlipOptions)
class NoisyFlipVerifier(_NoisyBase):
    """The base verifier with calibrated flip noise: P(draw = 1 - s) = flip_rate exactly."""

    def score_draws(self, completion: str, example: Example, key: DrawKey, draws: int) -> tuple[float, ...]:
        exact = self.exact(example).score(completion, example)
        rate = self.options.flip_rate
        return tuple(1.0 - exact if draw_rng(key, d).random() < rate else exact for d in range(draws))


@VERIFIERS.register("stochastic_grader", options=StochasticGraderOptions)
class StochasticGrader(_NoisyBase):
    """The base score plus independent Gaussian noise per draw, clamped to [0, 1]."""

    def score_draws(self, completion: str, example: Example, key: DrawKey, draws: int) -> tuple[float, ...]:
        exact = self.exact(example).score(completion, example)
        std = self.options.noise_std
        return tuple(min(1.0, max(0.0, exact + std * float(draw_rng(key, d).standard_normal())))
                     for d in range(draws))


def answer_checks(completion: str, example: Example) -> list[bool]:
    """The checks of an exact-match answer: one per gold character (same character at that
    position) and one for the length. All pass exactly when exact_match scores 1."""
    predicted = normalise(extract_answer(completion))
    gold = normalise(extract_answer(example.answer))
    if not predicted:
        return [False] * (len(gold) + 1)
    return [i < len(predicted) and predicted[i] == ch for i, ch in enumerate(gold)] + [len(predicted) == len(gold)]


@VERIFIERS.register("partial_checks", options=PartialChecksOptions)
class PartialChecksVerifier(_NoisyBase):
    """Scores 1 when every check of a random subset passes: a wrong answer that fails only
    unsampled checks passes (false positives, as a random half of the unit tests gives)."""

    def score_draws(self, completion: str, example: Example, key: DrawKey, draws: int) -> tuple[float, ...]:
        checks = answer_checks(completion, example)
        out = []
        for d in range(draws):
            rng = draw_rng(key, d)
            chosen = rng.random(len(checks)) < self.options.check_fraction
            if not chosen.any():
                chosen[int(rng.integers(len(checks)))] = True
            out.append(1.0 if all(c for c, keep in zip(checks, chosen) if keep) else 0.0)
        return tuple(out)

    def check_example(self, example: Example) -> None:
        get_verifier("exact_match").check_example(example)
