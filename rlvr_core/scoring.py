"""Score examples with an engine: the one scorer both parties use.

The owner scores its secret subsample with it (target_owner_node/worker.py), the trainer its
own examples (trainer_node/evaluation.py `local_accuracy`). A row's score is the mean verifier
score over its `samples_per_prompt` generations, clamped to [0, 1].

Why failures are confined to rows: on the owner, an error whose occurrence depends on which
rows were sampled would be a noise-free release (issue 11, hole 1). So anything that goes
wrong with ONE row (rendering, encoding, decoding, verifying, a NaN) scores that row 0, is
never raised and never logged with content. What cannot be confined to a row, an exception
in the batched forward pass, propagates: the caller turns it into one fixed error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from rlvr_core.engines.base import FixedShape, GenerationEngine, SamplingParams
from rlvr_core.engines.row_seeds import MAX_SEED
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.rendering import Rendering, as_rendering

ScoreFn = Callable[[str, Example], float]


@dataclass(frozen=True)
class Decoding:
    """How each row is decoded (public request parameters). top_p is always 1."""

    max_new_tokens: int
    samples_per_prompt: int
    temperature: float
    seed: int

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "samples_per_prompt", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"decoding.{name} must be an int, got {type(value).__name__}")
        if self.max_new_tokens < 1:
            raise ValueError(f"decoding.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.samples_per_prompt < 1:
            raise ValueError(f"decoding.samples_per_prompt must be >= 1, got {self.samples_per_prompt}")
        if not 0 <= self.seed < MAX_SEED:
            raise ValueError(f"decoding.seed must be in [0, 2**63), got {self.seed}")
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, int | float):
            raise TypeError(f"decoding.temperature must be a number, got {type(temperature).__name__}")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"decoding.temperature must be finite and >= 0 (0 = greedy), got {temperature}")

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=float(self.temperature), top_p=1.0, seed=self.seed
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decoding:
        """Build from a dict with exactly the four fields; errors (ValueError, TypeError) name the field."""
        if not isinstance(data, Mapping):
            raise TypeError(f"decoding must be an object, got {type(data).__name__}")
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in data]
        unknown = sorted(str(key) for key in data if key not in names)
        if missing or unknown:
            raise ValueError(f"decoding needs exactly the fields {', '.join(names)}; "
                             f"missing: {', '.join(missing) or '-'}; unknown: {', '.join(unknown) or '-'}")
        return cls(**{name: data[name] for name in names})


def score_rows(
    engine: GenerationEngine,
    examples: Sequence[Example],
    rendering: Rendering | str,
    decoding: Decoding,
    row_keys: Sequence[int],
    shape: FixedShape | None = None,
    *,
    score_fn: ScoreFn | None = None,
    verifier: Any = None,
) -> np.ndarray:
    """Scores in [0, 1], shape (len(examples),), one generate call for all rows.

    `row_keys[r]` (see `rlvr_core.engines.sampling.row_key`) seeds row r's randomness, so a
    row's score never depends on which other rows are scored. `rendering`
    (rlvr_core.tasks.rendering; a plain prompt template string is accepted) turns each row into
    the model input. `shape` (the owner) fixes every forward pass's shape. `score_fn` defaults to
    each row's verifier, draw 0 of the response keyed (decoding.seed, row_keys[r], sample index):
    `rlvr_core.verifiers.score_example` for an exact verifier, the row's own draw for a noisy one.
    `verifier` (a Verifier) scores every row instead of its own, e.g. the owner's noisy feedback
    grader on top of each row's exact verifier.
    Raises only for wrong arguments (ValueError naming the field) and for failures of the
    batched forward pass.
    """
    rendering = as_rendering(rendering)
    if len(row_keys) != len(examples):
        raise ValueError(f"row_keys has {len(row_keys)} entries for {len(examples)} examples; pass one per example")
    if not examples:
        return np.zeros(0)
    prompts = [_render_or_empty(rendering, example) for example in examples]
    generations = engine.generate(
        prompts, decoding.samples_per_prompt, decoding.sampling_params(), row_keys=row_keys, shape=shape
    )
    if score_fn is not None:
        return np.array([_row_score(samples, example, _unkeyed(score_fn))
                         for example, samples in zip(examples, generations)], dtype=np.float64)
    return sample_scores(generations, examples, decoding.seed, row_keys, verifier=verifier).mean(axis=1)


def sample_scores(
    generations: Sequence[Sequence[Any]], examples: Sequence[Example], seed: int, row_keys: Sequence[int],
    *, verifier: Any = None,
) -> np.ndarray:
    """(rows, samples) clamped scores of each generation (0 for a placeholder row or any failure),
    each the draw keyed (seed, row key, sample index) under `verifier` or the row's own."""
    samples = max((len(row) for row in generations), default=0)
    scores = np.zeros((len(examples), samples))
    for row, (example, generated) in enumerate(zip(examples, generations)):
        scorer = _keyed_scorer(seed, row_keys[row], verifier)
        scores[row, : len(generated)] = _sample_values(generated, example, scorer)
    return scores


SampleScoreFn = Callable[[str, Example, int], float]
"""(text, example, sample index) -> score."""


def _unkeyed(score_fn: ScoreFn) -> SampleScoreFn:
    return lambda text, example, _sample: score_fn(text, example)


def _keyed_scorer(seed: int, key: int, verifier: Any = None) -> SampleScoreFn:
    """Draw 0 of each sample of one row under `verifier` or its own, keyed by (seed, row key, sample)."""
    from rlvr_core.verifiers.base import get_verifier, score_draws_safely
    from rlvr_core.verifiers.draws import DrawKey

    def score(text: str, example: Example, sample: int) -> float:
        chosen = verifier if verifier is not None else get_verifier(example.verifier)
        return score_draws_safely(chosen, text, example, DrawKey(seed, key, sample), 1)[0]

    return score


def _render_or_empty(rendering: Rendering, example: Example) -> str:
    """The rendered prompt, or "" (the engine's placeholder row, scored 0) if rendering fails."""
    try:
        return str(rendering.render_example(example))
    except Exception:  # noqa: BLE001 - one row's failure must not fail the others
        return ""


def _row_score(samples: Sequence[Any], example: Example, score_fn: SampleScoreFn) -> float:
    """Mean clamped score of one row's samples; 0 for a placeholder row or any failure."""
    values = _sample_values(samples, example, score_fn)
    return sum(values) / len(values) if values else 0.0


def _sample_values(samples: Sequence[Any], example: Example, score_fn: SampleScoreFn) -> list[float]:
    """Clamped score of each of one row's samples; all 0 for a placeholder row or any failure."""
    try:
        if not samples or not all(sample.encoded for sample in samples):
            return [0.0] * len(samples)
        values = [float(score_fn(sample.text, example, k)) for k, sample in enumerate(samples)]
        return [min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0 for value in values]
    except Exception:  # noqa: BLE001 - never raised, never logged: the text could quote data
        return [0.0] * len(samples)
