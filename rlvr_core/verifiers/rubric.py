"""Rubric graders (issue 43): the exact grader of rubric rows and a noisy one of the seed's kinds.

    rubric          exact: the fraction of the row's rubric items the answer line meets (a graded
                    score in {0, 1/k, ..., 1}); the owner's test split and the final evaluation
    rubric_grader   noisy: per draw, a random subset of the items is checked (`check_fraction`),
                    each checked verdict is misjudged with probability `misjudge_rate`, and the
                    fraction met is jittered by N(0, `jitter_std`^2), clamped to [0, 1]

The three noise kinds are those of a rubric or model grader (seed 002: "grader randomness"); each
is a pure function below, so its statistics can be checked alone (tests/rlvr_core/
test_verifiers_rubric.py). A draw's randomness comes only from `draw_rng(key, d)` (the per-row rule
of docs/PRIVACY.md), and it reads its random numbers in a fixed order whatever the options, so a
level's draws are the same stream as another level's.

A row's items live in `metadata["rubric"]` (rlvr_core/tasks/rubric.py builds them); a row without
valid items is refused at load (`check_example`), naming the item and the field.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from rlvr_core.configuration import OptionsSection
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.rubric import EXACT_GRADER, METADATA_KEY, item_verdicts, parse_row_items
from rlvr_core.verifiers.base import VERIFIERS, Verifier, extract_answer, get_verifier
from rlvr_core.verifiers.draws import DrawKey, draw_rng


def verdicts(completion: str, example: Example) -> np.ndarray:
    """(k,) bool: each rubric item's exact verdict on the completion's answer line."""
    items = parse_row_items(example.metadata.get(METADATA_KEY))
    return np.array(item_verdicts(extract_answer(completion), items), dtype=bool)


@VERIFIERS.register(EXACT_GRADER)
class RubricVerifier(Verifier):
    """The exact rubric grader: the fraction of items met."""

    def score(self, completion: str, example: Example) -> float:
        return float(verdicts(completion, example).mean())

    def check_example(self, example: Example) -> None:
        try:
            parse_row_items(example.metadata.get(METADATA_KEY))
        except ValueError as error:
            raise ValueError(f"{EXACT_GRADER}: {error}") from None


class RubricGraderOptions(OptionsSection):
    name: Literal["rubric_grader"] = "rubric_grader"
    misjudge_rate: float = Field(default=0.1, ge=0.0, lt=0.5, description="Probability that a checked "
                                 "item's verdict is reported wrong (< 0.5: the grader stays informative).")
    check_fraction: float = Field(default=1.0, gt=0.0, le=1.0, description="Probability that each item "
                                  "is checked in a draw (at least one always is); the score is the fraction "
                                  "met among the checked items. 1 = every item.")
    jitter_std: float = Field(default=0.0, ge=0.0, le=1.0, description="Std of the Gaussian noise added to "
                              "the draw's fraction before clamping to [0, 1].")


def checked_subset(k: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """(k,) bool: each item kept with probability `fraction`; none kept: one drawn uniformly. Given
    its size the subset is uniform, so the fraction met over it is an unbiased estimate."""
    keep = rng.random(k) < fraction
    pick = int(rng.integers(k))  # drawn always: the stream's position does not depend on `keep`
    if not keep.any():
        keep[pick] = True
    return keep


def misjudged(exact: np.ndarray, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Each verdict flipped independently with probability `rate`."""
    return exact ^ (rng.random(exact.shape[0]) < rate)


def jittered(score: float, std: float, rng: np.random.Generator) -> float:
    """score + N(0, std^2), clamped to [0, 1]."""
    return min(1.0, max(0.0, score + std * float(rng.standard_normal())))


@VERIFIERS.register("rubric_grader", options=RubricGraderOptions)
class RubricGrader(Verifier):
    """A noisy rubric grader over the rows' own items (the exact verdicts are computed once)."""

    noisy = True

    def score(self, completion: str, example: Example) -> float:
        return self.score_draws(completion, example, DrawKey.of(0, example.id, 0), 1)[0]

    def score_draws(self, completion: str, example: Example, key: DrawKey, draws: int) -> tuple[float, ...]:
        exact = verdicts(completion, example)
        options = self.options
        out = []
        for d in range(draws):
            rng = draw_rng(key, d)
            keep = checked_subset(exact.shape[0], options.check_fraction, rng)
            seen = misjudged(exact, options.misjudge_rate, rng)
            out.append(jittered(float(seen[keep].mean()), options.jitter_std, rng))
        return tuple(out)

    def check_example(self, example: Example) -> None:
        get_verifier(EXACT_GRADER).check_example(example)
