"""rlvr_core.scoring: the one scorer (per-row confinement of failures) and Decoding."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rlvr_core.engines.base import FixedShape, Generation, GenerationEngine
from rlvr_core.engines.sampling import MAX_SEED, row_key
from rlvr_core.engines.transformers_engine import TransformersEngine
from rlvr_core.models import load_policy, random_tiny_policy
from rlvr_core.scoring import Decoding, score_rows
from rlvr_core.tasks.example import Example

TEMPLATE = "Question: {prompt}\nAnswer:"
DECODING = Decoding(max_new_tokens=5, samples_per_prompt=3, temperature=1.0, seed=4)


def _examples(count: int) -> list[Example]:
    return [Example(id=f"q{i}", prompt=f"Calculate {i} + {i % 3}.", answer=str(i + i % 3)) for i in range(count)]


class ScriptedEngine(GenerationEngine):
    """Returns the same `texts` for every prompt (one per sample) and records its calls."""

    name = "scripted"

    def __init__(self, texts: list[str], fail: bool = False) -> None:
        self.texts, self.fail, self.calls = texts, fail, []

    def generate(self, prompts, num_samples, params, row_keys=None, shape=None):
        self.calls.append((list(prompts), num_samples, params, list(row_keys), shape))
        if self.fail:
            raise RuntimeError("CUDA out of memory")
        return [
            [Generation(text, (1,) if prompt else (), (2,), True) if prompt else Generation("", (), (), False)
             for text in self.texts[:num_samples]]
            for prompt in prompts
        ]


def test_mean_over_samples_clamped_and_non_finite_is_zero() -> None:
    values = {"a": 1.0, "b": 0.5, "c": 7.0, "nan": math.nan, "inf": math.inf, "neg": -3.0}
    engine = ScriptedEngine(["a", "b", "c"])
    examples = _examples(2)
    scores = score_rows(engine, examples, TEMPLATE, DECODING, [1, 2], score_fn=lambda text, e: values[text])
    assert scores.shape == (2,) and np.allclose(scores, (1.0 + 0.5 + 1.0) / 3)
    engine = ScriptedEngine(["nan", "inf", "neg"])
    assert np.array_equal(score_rows(engine, examples, TEMPLATE, DECODING, [1, 2],
                                     score_fn=lambda text, e: values[text]), [0.0, 0.0])


def test_engine_gets_rendered_prompts_keys_shape_and_params() -> None:
    engine = ScriptedEngine(["x"] * 3)
    shape = FixedShape(prompt_tokens=16, batch_prompts=2)
    examples = _examples(3)
    score_rows(engine, examples, TEMPLATE, DECODING, [9, 8, 7], shape)
    prompts, num_samples, params, keys, got_shape = engine.calls[0]
    assert prompts == [TEMPLATE.format(prompt=e.prompt) for e in examples]
    assert (num_samples, keys, got_shape) == (3, [9, 8, 7], shape)
    assert (params.max_new_tokens, params.temperature, params.top_p, params.seed) == (5, 1.0, 1.0, 4)


def test_one_failing_row_scores_zero_and_the_others_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verifier crash, render crash, placeholder row: 0 for that row, no exception, nothing logged."""
    examples = _examples(4)

    def score(text: str, example: Example) -> float:
        if example.id == "q1":
            raise RuntimeError(f"verifier choked on {example.answer}")
        return 1.0

    from rlvr_core.tasks import rendering

    real_render = rendering.render_prompt

    def render(prompt: str, template: str) -> str:
        if prompt == examples[2].prompt:
            raise RuntimeError("render failed")
        return real_render(prompt, template)

    monkeypatch.setattr(rendering, "render_prompt", render)
    engine = ScriptedEngine(["x"] * 3)
    scores = score_rows(engine, examples, TEMPLATE, DECODING, [1, 2, 3, 4], score_fn=score)
    assert scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert engine.calls[0][0][2] == ""  # the failed render became the engine's placeholder row


def test_forward_failure_propagates_and_bad_arguments_raise() -> None:
    with pytest.raises(RuntimeError, match="out of memory"):
        score_rows(ScriptedEngine(["x"], fail=True), _examples(2), TEMPLATE, DECODING, [1, 2])
    with pytest.raises(ValueError, match="row_keys"):
        score_rows(ScriptedEngine(["x"]), _examples(2), TEMPLATE, DECODING, [1])
    engine = ScriptedEngine(["x"])
    assert score_rows(engine, [], TEMPLATE, DECODING, []).shape == (0,) and engine.calls == []


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> TransformersEngine:
    texts = [f"Question: Calculate {a} + {b}.\nAnswer: {a + b}" for a in range(10) for b in range(10)]
    model_dir: Path = random_tiny_policy(tmp_path_factory.mktemp("scoring") / "model", texts, seed=2, max_position=48)
    return TransformersEngine(*load_policy(model_dir), num_threads=1)


def _text_hash_score(text: str, example: Example) -> float:
    """A score that changes with almost any change of the text (exact match would mostly be 0)."""
    return (sum(ord(ch) * (i + 1) for i, ch in enumerate(text)) % 101) / 100


@pytest.mark.parametrize("temperature", [0.7, 2.0])
def test_add_one_row_changes_no_other_score(engine: TransformersEngine, temperature: float) -> None:
    """Sensitivity 1 end to end: rendering, engine with fixed shapes, scoring."""
    decoding = Decoding(max_new_tokens=6, samples_per_prompt=4, temperature=temperature, seed=11)
    shape = FixedShape(prompt_tokens=24, batch_prompts=3)
    examples = _examples(8)
    keys = [row_key(e.id) for e in examples]
    base = score_rows(engine, examples, TEMPLATE, decoding, keys, shape, score_fn=_text_hash_score)
    assert len(set(base.tolist())) > 2
    extra = Example(id="planted", prompt="Spell 'cat' backwards.", answer="tac")
    for position in (0, 3, 8):
        grown = examples[:position] + [extra] + examples[position:]
        scores = score_rows(engine, grown, TEMPLATE, decoding, [row_key(e.id) for e in grown], shape,
                            score_fn=_text_hash_score)
        assert np.array_equal(np.delete(scores, position), base)
    for position in (0, 5):
        shrunk = score_rows(engine, examples[:position] + examples[position + 1 :], TEMPLATE, decoding,
                            keys[:position] + keys[position + 1 :], shape, score_fn=_text_hash_score)
        assert np.array_equal(shrunk, np.delete(base, position))


def test_a_prompt_that_renders_empty_scores_zero(engine: TransformersEngine) -> None:
    examples = [Example(id="e", prompt="", answer=""), *_examples(2)]
    scores = score_rows(engine, examples, "{prompt}", DECODING, [1, 2, 3], FixedShape(24, 2),
                        score_fn=lambda text, e: 1.0)
    assert scores.tolist() == [0.0, 1.0, 1.0]


def test_default_score_fn_is_the_verifier(engine: TransformersEngine) -> None:
    from rlvr_core.verifiers import score_example

    examples = _examples(3)
    scores = score_rows(engine, examples, TEMPLATE, DECODING, [1, 2, 3])
    prompts = [TEMPLATE.format(prompt=e.prompt) for e in examples]
    generations = engine.generate(prompts, 3, DECODING.sampling_params(), row_keys=[1, 2, 3])
    expected = [sum(score_example(g.text, e) for g in group) / 3 for group, e in zip(generations, examples)]
    assert scores.tolist() == expected


def test_decoding_round_trips_and_names_bad_fields() -> None:
    assert Decoding.from_json(DECODING.to_json()) == DECODING
    assert DECODING.to_json() == {"max_new_tokens": 5, "samples_per_prompt": 3, "temperature": 1.0, "seed": 4}
    with pytest.raises(ValueError, match=r"missing: seed; unknown: top_p"):
        Decoding.from_json({"max_new_tokens": 5, "samples_per_prompt": 3, "temperature": 1.0, "top_p": 1})
    for field, value, error in [
        ("seed", MAX_SEED, ValueError), ("seed", -1, ValueError), ("seed", 1.0, TypeError),
        ("max_new_tokens", 0, ValueError), ("samples_per_prompt", 0, ValueError),
        ("temperature", -0.1, ValueError), ("temperature", math.inf, ValueError), ("temperature", "1", TypeError),
        ("max_new_tokens", True, TypeError),
    ]:
        with pytest.raises(error, match=rf"decoding\.{field}"):
            Decoding(**{**DECODING.to_json(), field: value})
    assert Decoding(**{**DECODING.to_json(), "seed": MAX_SEED - 1}).seed == MAX_SEED - 1
