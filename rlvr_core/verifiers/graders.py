"""Graders: the several-scores view of verifiers that the trainer's rollouts use.

A grader is `(completion, example, key, draws) -> tuple of draws scores` (rlvr_core/verifiers/
draws.py for `key`). `make_grader(spec)` builds one from a verifier spec (a testbed's
`source_grader`) or, with no spec, from each row's own verifier; `repeat_reward` adapts any
one-score reward function (every draw equal, the default adapter).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rlvr_core.tasks.example import Example
from rlvr_core.verifiers.base import get_verifier, make_verifier, score_draws_safely
from rlvr_core.verifiers.draws import DrawKey

Grader = Callable[[str, Example, DrawKey, int], tuple[float, ...]]


def make_grader(spec: str | Mapping[str, Any] | None = None) -> Grader:
    """A grader from a verifier spec (validated now: errors name the option), or None: each
    row's own verifier."""
    fixed = None if spec is None else make_verifier(spec)

    def grade(completion: str, example: Example, key: DrawKey, draws: int) -> tuple[float, ...]:
        verifier = fixed if fixed is not None else get_verifier(example.verifier)
        return score_draws_safely(verifier, completion, example, key, draws)

    return grade


def repeat_reward(reward_fn: Callable[[str, Example], float]) -> Grader:
    """A one-score reward as a grader: its draws are all that score."""

    def grade(completion: str, example: Example, key: DrawKey, draws: int) -> tuple[float, ...]:
        return (float(reward_fn(completion, example)),) * draws

    return grade
