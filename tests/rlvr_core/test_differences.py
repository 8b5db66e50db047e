"""Teacher forcing and per-row accuracy differences (rlvr_core/differences.py): the values each
metric gives, the clip, failures confined to a row, and the fixed-shape invariances the owner's
difference releases rely on (a row's value depends on nothing but that row)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rlvr_core.differences import (
    DIFFERENCE_METRICS,
    Completions,
    answer_completion,
    build_completions,
    clipped_differences,
    difference_metric,
    release_differences,
    scoring_temperature,
)
from rlvr_core.engines.base import FixedShape, SamplingParams
from rlvr_core.engines.sampling import row_key
from rlvr_core.engines.transformers_engine import TransformersEngine
from rlvr_core.models import load_policy, random_tiny_policy
from rlvr_core.scoring import Decoding
from rlvr_core.tasks.example import Example

TEXTS = [f"Calculate {a} + {b}.\nAnswer: {a + b}" for a in range(10) for b in range(10)]
EXAMPLES = [Example(f"row-{a}", f"Calculate {a} + {9 - a}{', please' * (a % 3)}.", "9", verifier="exact_match")
            for a in range(8)]
KEYS = [row_key(e.id) for e in EXAMPLES]
SHAPE = FixedShape(prompt_tokens=32, batch_prompts=3)
TEMPLATE = "{prompt}\nAnswer:"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_tiny_policy(tmp_path_factory.mktemp("differences") / "model", TEXTS, seed=3, max_position=48)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> TransformersEngine:
    model, tokenizer = load_policy(model_dir)
    return TransformersEngine(model, tokenizer)


def _perturbed(engine: TransformersEngine, scale: float, seed: int = 0) -> TransformersEngine:
    model = copy.deepcopy(engine.model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return TransformersEngine(model, engine.tokenizer)


def _manual_logprob(engine: TransformersEngine, prompt: tuple[int, ...], completion: tuple[int, ...], temperature: float) -> float:
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, :-1].float() / temperature
    picked = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return float(picked[len(prompt) - 1 :].sum())


def test_completion_logprobs_equal_a_plain_forward_pass(engine: TransformersEngine) -> None:
    prompts = engine.encode_prompts([TEMPLATE.format(prompt=e.prompt) for e in EXAMPLES[:4]], 5, SHAPE)
    completions = [[c] for c in engine.encode_completions([" 9", " 10", " 1", " 99"], 5)]
    got = engine.completion_logprobs(prompts, completions, 0.7, 5, SHAPE)
    assert got.shape == (4, 1)
    for row in range(4):
        assert got[row, 0] == pytest.approx(_manual_logprob(engine, prompts[row], completions[row][0], 0.7), abs=1e-4)


def test_encode_completions_appends_eos_and_cuts(engine: TransformersEngine) -> None:
    full = engine.encode_completions([" 12"], 10)[0]
    assert full[-1] == engine.eos_id
    assert engine.encode_completions([" 12"], 1)[0] == full[:1]


def test_a_rows_logprob_does_not_depend_on_its_batch_mates(engine: TransformersEngine) -> None:
    """The add/remove-one-row argument of a difference release: under fixed shapes, adding a row
    (which moves every later row to another batch slot) leaves every other row's value identical."""
    prompts = engine.encode_prompts([TEMPLATE.format(prompt=e.prompt) for e in EXAMPLES], 5, SHAPE)
    completions = [[c, c[:1]] for c in engine.encode_completions([f" {a}" for a in range(8)], 5)]
    base = engine.completion_logprobs(prompts, completions, 1.0, 5, SHAPE)
    extra_prompt = engine.encode_prompts(["Spell 'dog' backwards.\nAnswer:"], 5, SHAPE)[0]
    extra = engine.encode_completions([" god"], 5)[0]
    for position in (0, 4, 8):
        grown = engine.completion_logprobs(prompts[:position] + [extra_prompt] + prompts[position:],
                                           completions[:position] + [[extra, extra]] + completions[position:],
                                           1.0, 5, SHAPE)
        assert np.array_equal(np.delete(grown, position, axis=0), base)


def test_fixed_shape_passes_have_one_shape_whatever_the_rows(engine: TransformersEngine, monkeypatch) -> None:
    shapes: list[tuple[int, ...]] = []
    original = engine.model.forward

    def recording(*args, **kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return original(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", recording)
    prompts = engine.encode_prompts([TEMPLATE.format(prompt=e.prompt) for e in EXAMPLES[:5]], 4, SHAPE)
    short = [[(engine.eos_id,)] for _ in prompts]
    long = [[c] for c in engine.encode_completions([" 1 2 3 4 5 6"] * 5, 4)]
    engine.completion_logprobs(prompts, short, 1.0, 4, SHAPE)
    engine.completion_logprobs(prompts[:2] + [()] + prompts[3:], long, 1.0, 4, SHAPE)
    assert set(shapes) == {(3, 36)} and len(shapes) == 4  # two passes each: 3 prompts, then 2 + a dummy


def test_answer_probability_is_the_change_in_the_references_probability(engine: TransformersEngine) -> None:
    other = _perturbed(engine, 0.05)
    decoding = Decoding(max_new_tokens=4, samples_per_prompt=1, temperature=0.0, seed=3)
    metric = difference_metric("answer_probability")
    engines = {"base": engine, "other": other}
    values = release_differences(engines.get, "base", ["other", "base"], metric, EXAMPLES, TEMPLATE, decoding, KEYS,
                                 clip=1.0, shape=SHAPE)
    assert values.shape == (2, len(EXAMPLES))
    assert np.all(values[1] == 0.0)  # the base against itself
    prompts = engine.encode_prompts([TEMPLATE.format(prompt=e.prompt) for e in EXAMPLES], 4, SHAPE)
    answer = engine.encode_completions([" 9"], 4)[0]
    for row in (0, 5):
        expected = math.exp(_manual_logprob(other, prompts[row], answer, 1.0)) - math.exp(
            _manual_logprob(engine, prompts[row], answer, 1.0))
        assert values[0, row] == pytest.approx(expected, abs=1e-5)


def test_importance_weighs_the_bases_own_samples(engine: TransformersEngine) -> None:
    other = _perturbed(engine, 0.05)
    decoding = Decoding(max_new_tokens=4, samples_per_prompt=3, temperature=1.0, seed=11)
    metric = difference_metric("importance")
    completions = build_completions(engine, metric, EXAMPLES, TEMPLATE, decoding, KEYS, SHAPE)
    assert completions.rewards.shape == (len(EXAMPLES), 3)
    base = engine.completion_logprobs(completions.prompt_ids, completions.completion_ids, 1.0, 4, SHAPE)
    cand = other.completion_logprobs(completions.prompt_ids, completions.completion_ids, 1.0, 4, SHAPE)
    rewards = completions.rewards
    loo = (rewards.sum(1, keepdims=True) - rewards) / 2
    expected = ((rewards - loo) * (np.exp(cand - base) - 1)).mean(1)
    assert np.allclose(clipped_differences(metric, completions, base, cand, 10.0), expected)
    # the samples are the engine's own: generate with the same keys gives the same completions
    again = engine.generate([TEMPLATE.format(prompt=e.prompt) for e in EXAMPLES], 3,
                            SamplingParams(max_new_tokens=4, temperature=1.0, seed=11), KEYS, SHAPE)
    assert [[g.completion_ids for g in row] for row in again] == completions.completion_ids


def test_sampling_metrics_need_a_temperature() -> None:
    greedy = Decoding(max_new_tokens=4, samples_per_prompt=1, temperature=0.0, seed=0)
    with pytest.raises(ValueError, match="decoding.temperature"):
        scoring_temperature(difference_metric("importance"), greedy)
    assert scoring_temperature(difference_metric("answer_probability"), greedy) == 1.0


def test_values_are_clipped_and_failed_rows_are_zero() -> None:
    metric = difference_metric("log_ratio")
    completions = Completions(prompt_ids=[(1, 2), (), (3,)], completion_ids=[[(4,)], [(5,)], [()]],
                              rewards=np.array([[1.0], [1.0], [1.0]]), temperature=1.0, completion_tokens=2)
    base = np.zeros((3, 1))
    cand = np.array([[5.0], [5.0], [5.0]])
    assert clipped_differences(metric, completions, base, cand, 0.25).tolist() == [0.25, 0.0, 0.0]
    assert clipped_differences(metric, completions, base, -cand, 0.25).tolist() == [-0.25, 0.0, 0.0]
    nan = np.array([[np.nan], [0.0], [0.0]])
    assert clipped_differences(metric, completions, base, nan, 1.0).tolist() == [0.0, 0.0, 0.0]


def test_importance_never_overflows_before_the_clip() -> None:
    metric = difference_metric("importance")
    completions = Completions([(1,)], [[(2,), (3,)]], np.array([[1.0, 0.0]]), 1.0, 1)
    values = clipped_differences(metric, completions, np.zeros((1, 2)), np.array([[900.0, 0.0]]), 0.5)
    assert values.tolist() == [0.5]


def test_an_unrenderable_row_scores_zero_for_every_candidate(engine: TransformersEngine) -> None:
    from rlvr_core.tasks.rendering import Rendering

    class FailsOnOneRow(Rendering):
        def render_example(self, example):
            if example.id == "row-1":
                raise ValueError("cannot render")
            return super().render_example(example)

    other = _perturbed(engine, 0.05)
    decoding = Decoding(max_new_tokens=4, samples_per_prompt=1, temperature=0.0, seed=3)
    values = release_differences({"b": engine, "o": other}.get, "b", ["o"], difference_metric("answer_probability"),
                                 EXAMPLES[:3], FailsOnOneRow(TEMPLATE), decoding, KEYS[:3], 1.0, SHAPE)
    assert values[0, 1] == 0.0 and values[0, 0] != 0.0 and values[0, 2] != 0.0


def test_the_answer_template_writes_the_reference() -> None:
    example = Example("a", "q", "{x} 12")
    assert answer_completion(" {answer}", example) == " {x} 12"  # no format(): braces in answers are data
    assert answer_completion("The answer is {answer}.", example) == "The answer is {x} 12."


def test_every_builtin_metric_is_registered() -> None:
    assert {"answer_probability", "importance", "log_ratio"} <= set(DIFFERENCE_METRICS.names())
    assert not difference_metric("answer_probability").generates
    assert difference_metric("importance").generates and difference_metric("log_ratio").generates
