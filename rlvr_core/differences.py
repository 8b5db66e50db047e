"""Per-row accuracy differences between a base model and candidates, by teacher forcing.

A difference release (docs/PRIVACY.md, "Difference releases") answers "how much more accurate
than the base is each candidate?" on one secret subsample. Sampled 0/1 accuracy answers it
badly: two close candidates differ on a handful of rows, and each row's score can change by a
whole point. Here every candidate is scored on the SAME completions, so each row contributes a
small, continuous value, and the owner clips it to a public bound c, so the noise of the
release is calibrated to c instead of 1:

1. the completions: the base's own samples of each row (keyed by seed, row id and sample
   index, as every owner generation is) scored by the row's verifier, or the row's reference
   answer written as a completion (`answer_template`);
2. for the base and every candidate, the log-probability of each completion given its prompt
   (`GenerationEngine.completion_logprobs`: one forward pass per batch, fixed shapes);
3. a registered `DifferenceMetric` turns (rewards, base log-probs, candidate log-probs) into
   one value per row, an estimate of accuracy(candidate) - accuracy(base) on that row;
4. each value is clipped to [-c, c].

The metrics:
- "answer_probability": p_candidate(reference) - p_base(reference): the change in the
  probability that a sample is exactly the reference answer. No generation at all; for
  short-answer tasks.
- "importance": mean_j (r_j - b_j) (p_candidate(y_j) / p_base(y_j) - 1) over the base's samples
  y_j with rewards r_j: the importance-sampling estimate of the change in sampled accuracy
  (unbiased for any baseline b_j independent of sample j; b_j is the mean reward of the
  row's other samples, 0 with one sample). Correct with chain-of-thought: it weighs the
  policy's own completions.
- "log_ratio": the same with log(p_candidate / p_base) for (ratio - 1): the first-order form,
  bounded where the ratio is not.

Both parties run this module: the owner on its held-out rows (target_owner_node/worker.py),
the trainer on its own prompts to choose c (trainer_node/feedback/clip_calibration.py). A
failure confined to one row (it cannot be rendered or encoded) gives that row 0 for every
candidate; only a failure of a whole forward pass raises.

To add a metric:
    @DIFFERENCE_METRICS.register("mine")
    class Mine(DifferenceMetric):
        generates = True   # teacher-forces the base's samples (False: the reference answer)
        def row_values(self, rewards, base, candidate): ...
(a plug-in: entry point `target_feedback.difference_metrics`). An owner serves the metrics its
config lists; GetInfo publishes them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from protocol.plugins import Registry, subclass_entries
from rlvr_core.engines.base import FixedShape, GenerationEngine
from rlvr_core.scoring import Decoding, sample_scores
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.rendering import Rendering, as_rendering

DEFAULT_ANSWER_TEMPLATE = " {answer}"
"""How a reference answer is written as a completion: after a prompt ending in "Answer:", a space
and the answer (then EOS). An owner whose model answers otherwise declares its own."""

ANSWER_FIELD = "{answer}"


class DifferenceMetric(ABC):
    """One way to turn teacher-forced log-probabilities into per-row accuracy differences."""

    name: ClassVar[str] = ""  # set by registration
    generates: ClassVar[bool] = True
    """True: the completions are the base's own samples, scored by the verifier (needs a decoding
    temperature > 0, the distribution the samples are drawn from). False: the reference answer."""

    @abstractmethod
    def row_values(self, rewards: np.ndarray, base: np.ndarray, candidate: np.ndarray) -> np.ndarray:
        """rewards, base and candidate log-probs, each (rows, samples) -> (rows,) differences."""


DIFFERENCE_METRICS: Registry[type[DifferenceMetric]] = Registry(
    "difference_metrics", noun="difference metric",
    on_add=subclass_entries(DifferenceMetric, "difference metric"),
)


def difference_metric(name: str) -> DifferenceMetric:
    """The registered metric `name`; UnknownEntry (a ValueError) listing the known ones."""
    return DIFFERENCE_METRICS.get(name)()


def difference_metric_names() -> list[str]:
    return DIFFERENCE_METRICS.names()


def _leave_one_out(rewards: np.ndarray) -> np.ndarray:
    """Each sample's baseline: the mean reward of its row's other samples (0 with one sample)."""
    samples = rewards.shape[1]
    if samples < 2:
        return np.zeros_like(rewards)
    return (rewards.sum(axis=1, keepdims=True) - rewards) / (samples - 1)


@DIFFERENCE_METRICS.register("answer_probability")
class AnswerProbability(DifferenceMetric):
    """p_candidate(reference answer) - p_base(reference answer)."""

    generates = False

    def row_values(self, rewards, base, candidate):
        return (np.exp(candidate) - np.exp(base)).mean(axis=1)


@DIFFERENCE_METRICS.register("importance")
class Importance(DifferenceMetric):
    """mean_j (r_j - b_j) * (p_candidate(y_j) / p_base(y_j) - 1) over the base's samples."""

    def row_values(self, rewards, base, candidate):
        ratio = np.exp(np.minimum(candidate - base, 50.0))  # clipped afterwards; no overflow to inf
        return ((rewards - _leave_one_out(rewards)) * (ratio - 1.0)).mean(axis=1)


@DIFFERENCE_METRICS.register("log_ratio")
class LogRatio(DifferenceMetric):
    """mean_j (r_j - b_j) * log(p_candidate(y_j) / p_base(y_j)): importance to first order."""

    def row_values(self, rewards, base, candidate):
        return ((rewards - _leave_one_out(rewards)) * (candidate - base)).mean(axis=1)


@dataclass(frozen=True)
class Completions:
    """What every model of one difference release is teacher-forced on."""

    prompt_ids: list[tuple[int, ...]]
    completion_ids: list[list[tuple[int, ...]]]  # (rows, samples)
    rewards: np.ndarray  # (rows, samples) in [0, 1]; 1 for a reference answer
    temperature: float
    completion_tokens: int


def scoring_temperature(metric: DifferenceMetric, decoding: Decoding) -> float:
    """The temperature log-probabilities are taken at: the sampling temperature for a metric that
    samples (it must be > 0), else the request's temperature, or 1 when it is greedy."""
    if metric.generates:
        if decoding.temperature <= 0:
            raise ValueError(f"decoding.temperature must be > 0 for difference metric {metric.name!r}: "
                             "it weighs the base's own samples")
        return float(decoding.temperature)
    return float(decoding.temperature) if decoding.temperature > 0 else 1.0


def answer_completion(template: str, example: Example) -> str:
    """The reference answer written as a completion (the template's {answer} replaced)."""
    return template.replace(ANSWER_FIELD, example.answer)


def build_completions(
    engine: GenerationEngine,
    metric: DifferenceMetric,
    examples: Sequence[Example],
    rendering: Rendering | str | Callable[[Example], str],
    decoding: Decoding,
    row_keys: Sequence[int],
    shape: FixedShape | None = None,
    *,
    verifier: Any = None,
    answer_template: str = DEFAULT_ANSWER_TEMPLATE,
) -> Completions:
    """The completions of one release, from the BASE model's engine (call it with the base loaded).
    `rendering` is a Rendering, a prompt template, or a function example -> model input."""
    render = rendering if callable(rendering) and not isinstance(rendering, Rendering) else \
        as_rendering(rendering).render_example
    temperature = scoring_temperature(metric, decoding)
    if len(row_keys) != len(examples):
        raise ValueError(f"row_keys has {len(row_keys)} entries for {len(examples)} examples; pass one per example")
    prompts = [_render_or_empty(render, example) for example in examples]
    if metric.generates:
        generations = engine.generate(
            prompts, decoding.samples_per_prompt, decoding.sampling_params(), row_keys=row_keys, shape=shape
        )
        rewards = sample_scores(generations, examples, decoding.seed, row_keys, verifier=verifier)
        prompt_ids = [samples[0].prompt_ids if samples else () for samples in generations]
        completion_ids = [[sample.completion_ids if sample.encoded else () for sample in samples]
                          for samples in generations]
    else:
        prompt_ids = engine.encode_prompts(prompts, decoding.max_new_tokens, shape)
        texts = [_answer_or_empty(answer_template, example) for example in examples]
        completion_ids = [[ids] for ids in engine.encode_completions(texts, decoding.max_new_tokens)]
        rewards = np.ones((len(examples), 1))
    return Completions(list(prompt_ids), completion_ids, rewards, temperature, decoding.max_new_tokens)


def completion_logprobs(engine: GenerationEngine, completions: Completions, shape: FixedShape | None = None) -> np.ndarray:
    """(rows, samples) log-probabilities of the release's completions under the engine's model."""
    return engine.completion_logprobs(completions.prompt_ids, completions.completion_ids,
                                      completions.temperature, completions.completion_tokens, shape)


def clipped_differences(
    metric: DifferenceMetric, completions: Completions, base: np.ndarray, candidate: np.ndarray, clip: float
) -> np.ndarray:
    """(rows,) values in [-clip, clip]; a row with no usable completion (or a non-finite value) is 0."""
    values = np.asarray(metric.row_values(completions.rewards, base, candidate), dtype=np.float64)
    usable = np.array([bool(p) and any(c for c in row) for p, row in zip(completions.prompt_ids,
                                                                          completions.completion_ids)])
    values = np.where(usable & np.isfinite(values), values, 0.0)
    return np.clip(values, -clip, clip)


def release_differences(
    load: Callable[[Any], GenerationEngine],
    base: Any,
    candidates: Sequence[Any],
    metric: DifferenceMetric,
    examples: Sequence[Example],
    rendering: Rendering | str | Callable[[Example], str],
    decoding: Decoding,
    row_keys: Sequence[int],
    clip: float,
    shape: FixedShape | None = None,
    *,
    verifier: Any = None,
    answer_template: str = DEFAULT_ANSWER_TEMPLATE,
) -> np.ndarray:
    """(len(candidates), rows) clipped differences of each candidate from the base.

    `load(handle)` returns an engine running that model (the owner's worker swaps weights into
    one resident model; the trainer loads state dicts into a scratch copy). The base is loaded
    first, for its completions and log-probs, then each candidate in turn."""
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    engine = load(base)
    completions = build_completions(engine, metric, examples, rendering, decoding, row_keys, shape,
                                    verifier=verifier, answer_template=answer_template)
    base_logprobs = completion_logprobs(engine, completions, shape)
    out = np.zeros((len(candidates), len(examples)))
    for position, candidate in enumerate(candidates):
        candidate_logprobs = completion_logprobs(load(candidate), completions, shape)
        out[position] = clipped_differences(metric, completions, base_logprobs, candidate_logprobs, clip)
    return out


def _render_or_empty(render: Callable[[Example], str], example: Example) -> str:
    try:
        return str(render(example))
    except Exception:  # noqa: BLE001 - one row's failure must not fail the others
        return ""


def _answer_or_empty(template: str, example: Example) -> str:
    try:
        return answer_completion(template, example)
    except Exception:  # noqa: BLE001 - confined to its row
        return ""
