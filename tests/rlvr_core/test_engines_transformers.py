"""TransformersEngine: shapes, determinism, seeded pairing, EOS, left padding, truncation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr_core.engines.base import Generation, SamplingParams
from rlvr_core.engines.sampling import select_tokens
from rlvr_core.engines.throughput import measure_throughput
from rlvr_core.engines.transformers_engine import TransformersEngine
from rlvr_core.models import load_policy, random_tiny_policy

TEXTS = [f"Calculate {a} + {b}.\nAnswer: {a + b}" for a in range(12) for b in range(12)]
PROMPTS = [
    "Calculate 3 + 4.\nAnswer:",
    "Hi",
    "Calculate 11 + 7, and then think about it for a long while before answering.\nAnswer:",
    "Spell 'cat' backwards.\nAnswer:",
]
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=6, temperature=1.0, seed=11)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and OpenMP spinning is slow on a busy box."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_tiny_policy(tmp_path_factory.mktemp("engine") / "model", TEXTS, seed=5, max_position=48)



@pytest.fixture(scope="module")
def engine(model_dir: Path) -> TransformersEngine:
    model, tokenizer = load_policy(model_dir)
    return TransformersEngine(model, tokenizer, batch_size=16)


def _ids(results: list[list[Generation]]) -> list[list[tuple[int, ...]]]:
    return [[g.completion_ids for g in group] for group in results]


def test_shapes_and_fields(engine: TransformersEngine) -> None:
    results = engine.generate(PROMPTS, 3, SAMPLED)
    assert [len(group) for group in results] == [3] * len(PROMPTS)
    for prompt, group in zip(PROMPTS, results):
        for generation in group:
            full = engine.tokenizer(prompt, add_special_tokens=False, verbose=False)["input_ids"]
            assert generation.prompt_ids == tuple(full[-(48 - SAMPLED.max_new_tokens) :])
            assert 1 <= len(generation.completion_ids) <= SAMPLED.max_new_tokens
            assert generation.text == engine.tokenizer.decode(generation.completion_ids, skip_special_tokens=True)
    assert engine.generate([], 3, SAMPLED) == []


def test_greedy_is_deterministic_and_identical_across_samples(engine: TransformersEngine) -> None:
    first = engine.generate(PROMPTS, 2, GREEDY)
    assert _ids(first) == _ids(engine.generate(PROMPTS, 2, GREEDY))
    assert all(group[0] == group[1] for group in first)


def test_seeded_sampling_is_reproducible_and_seed_dependent(engine: TransformersEngine) -> None:
    first = _ids(engine.generate(PROMPTS, 4, SAMPLED))
    assert first == _ids(engine.generate(PROMPTS, 4, SAMPLED))
    other = _ids(engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=6, temperature=1.0, seed=12)))
    assert other != first
    assert any(len(set(group)) > 1 for group in first)  # samples of one prompt differ


def test_results_do_not_depend_on_batching_or_global_rng(engine: TransformersEngine) -> None:
    """Paired evaluation: only (weights, prompts, num_samples, params) matter."""
    expected = _ids(engine.generate(PROMPTS, 4, SAMPLED))
    torch.manual_seed(12345)
    small_batches = TransformersEngine(engine.model, engine.tokenizer, batch_size=1, num_threads=2)
    assert _ids(small_batches.generate(PROMPTS, 4, SAMPLED)) == expected
    assert torch.get_num_threads() == 1  # the engine's thread setting is scoped to generate()


def test_tiny_top_p_equals_greedy(engine: TransformersEngine) -> None:
    nucleus = SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1e-6, seed=3)
    assert _ids(engine.generate(PROMPTS, 2, nucleus)) == _ids(engine.generate(PROMPTS, 2, GREEDY))


def test_left_padding_does_not_change_greedy_output(engine: TransformersEngine) -> None:
    together = engine.generate(PROMPTS, 1, GREEDY)
    for index, prompt in enumerate(PROMPTS):
        alone = engine.generate([prompt], 1, GREEDY)
        assert alone[0][0].completion_ids == together[index][0].completion_ids


def test_eos_stops_generation(model_dir: Path) -> None:
    model, tokenizer = load_policy(model_dir)
    eos = tokenizer.eos_token_id
    hidden = model.config.hidden_size
    head = torch.nn.Linear(hidden, model.config.vocab_size, bias=True)  # untied copy, EOS boosted
    with torch.no_grad():
        head.weight.copy_(model.get_input_embeddings().weight)
        head.bias.zero_()
        head.bias[eos] = 4.0
    model.lm_head = head
    engine = TransformersEngine(model, tokenizer, batch_size=8)
    results = engine.generate(PROMPTS, 8, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))
    flat = [g for group in results for g in group]
    assert any(g.finished for g in flat) and any(len(g.completion_ids) > 1 for g in flat)
    for g in flat:
        assert g.finished == (eos in g.completion_ids)
        assert eos not in g.completion_ids[:-1]  # nothing after EOS
        assert "<|endoftext|>" not in g.text
        if not g.finished:
            assert len(g.completion_ids) == 6
    with torch.no_grad():
        head.bias[eos] = 1e4
    forced = engine.generate(PROMPTS[:2], 2, GREEDY)
    assert all(g.completion_ids == (eos,) and g.finished and g.text == "" for group in forced for g in group)


def test_long_prompts_are_truncated_from_the_left(engine: TransformersEngine) -> None:
    long_prompt = " ".join(f"word{i}" for i in range(200)) + "\nAnswer:"
    full = engine.tokenizer(long_prompt, add_special_tokens=False, verbose=False)["input_ids"]
    result = engine.generate([long_prompt], 1, GREEDY)[0][0]
    assert result.prompt_ids == tuple(full[-(48 - GREEDY.max_new_tokens) :])


def test_training_mode_is_restored(engine: TransformersEngine) -> None:
    engine.model.train()
    engine.generate(PROMPTS[:1], 1, GREEDY)
    assert engine.model.training
    engine.model.eval()
    engine.generate(PROMPTS[:1], 1, GREEDY)
    assert not engine.model.training
    engine.sync_weights()  # no-op: the engine holds the live model


@pytest.mark.parametrize(
    ("params", "num_samples", "field"),
    [
        (SamplingParams(temperature=-1.0), 1, "temperature"),
        (SamplingParams(top_p=0.0), 1, "top_p"),
        (SamplingParams(max_new_tokens=0), 1, "max_new_tokens"),
        (SamplingParams(max_new_tokens=48), 1, "max_new_tokens"),
        (SamplingParams(seed=-1), 1, "seed"),
        (SamplingParams(), 0, "num_samples"),
    ],
)
def test_invalid_arguments_name_the_field(engine: TransformersEngine, params, num_samples, field) -> None:
    with pytest.raises(ValueError, match=field):
        engine.generate(PROMPTS, num_samples, params)


@pytest.mark.parametrize(("option", "value"), [("batch_size", 0), ("num_threads", 0)])
def test_invalid_engine_options_name_the_option(engine: TransformersEngine, option: str, value: int) -> None:
    with pytest.raises(ValueError, match=option):
        TransformersEngine(engine.model, engine.tokenizer, **{option: value})


def test_empty_prompt_gets_placeholders_and_leaves_the_others_alone(engine: TransformersEngine) -> None:
    """An empty prompt is not an error (its occurrence could depend on which rows were drawn)."""
    keys = [5, 6, 7]
    results = engine.generate([PROMPTS[0], "", PROMPTS[3]], 2, SAMPLED, row_keys=keys)
    assert results[1] == [Generation("", (), (), False)] * 2 and not results[1][0].encoded
    assert _ids([results[0], results[2]]) == _ids(engine.generate([PROMPTS[0], PROMPTS[3]], 2, SAMPLED, [5, 7]))
    assert engine.generate([""], 1, GREEDY) == [[Generation("", (), (), False)]]


def test_row_keys_make_rows_independent_of_their_neighbours(engine: TransformersEngine) -> None:
    """With explicit keys, a row's samples do not depend on the other prompts or their order."""
    keys = [101, 102, 103, 104]
    together = _ids(engine.generate(PROMPTS, 3, SAMPLED, row_keys=keys))
    for index, prompt in enumerate(PROMPTS):
        assert _ids(engine.generate([prompt], 3, SAMPLED, row_keys=[keys[index]])) == [together[index]]
    reordered = _ids(engine.generate(PROMPTS[::-1], 3, SAMPLED, row_keys=keys[::-1]))
    assert reordered == together[::-1]


def test_positional_keys_are_the_default(engine: TransformersEngine) -> None:
    assert _ids(engine.generate(PROMPTS, 3, SAMPLED)) == _ids(engine.generate(PROMPTS, 3, SAMPLED, [0, 1, 2, 3]))


@pytest.mark.parametrize("keys", [[1, 2, 3], [1, 2, 3, -1], [1, 2, 3, 2**63], [1, 2, 3, True], [1, 2, 3, "4"]])
def test_bad_row_keys_name_the_argument(engine: TransformersEngine, keys) -> None:
    with pytest.raises(ValueError, match=r"row_keys"):
        engine.generate(PROMPTS, 1, GREEDY, row_keys=keys)


def test_tokenizer_ids_outside_the_embedding_are_refused(model_dir: Path) -> None:
    """The engine feeds pad ids itself: one past the embedding would fail every batch."""
    model, tokenizer = load_policy(model_dir)
    rows = model.get_input_embeddings().num_embeddings
    tokenizer.pad_token = None
    tokenizer.add_special_tokens({"pad_token": "<|bogus-pad|>"})  # id past the embedding
    assert tokenizer.pad_token_id >= rows
    with pytest.raises(ValueError, match="pad_token_id"):
        TransformersEngine(model, tokenizer)


def test_select_tokens_samples_the_distribution() -> None:
    probs = torch.tensor([0.1, 0.6, 0.3])
    uniforms = (torch.arange(3000, dtype=torch.float64) + 0.5) / 3000
    tokens = select_tokens(probs.log().expand(3000, 3), 1.0, 1.0, uniforms)
    counts = torch.bincount(tokens, minlength=3).float() / 3000
    assert torch.allclose(counts, torch.tensor([0.1, 0.6, 0.3]), atol=0.002)
    assert tokens[0] == 1  # a uniform near 0 picks the most likely token (paired coupling)
    nucleus = select_tokens(probs.log().expand(3000, 3), 1.0, 0.8, uniforms)
    assert set(nucleus.tolist()) == {1, 2}  # the 0.1 token is outside the top-0.8 set


def test_throughput_helper_counts_outputs(engine: TransformersEngine) -> None:
    report = measure_throughput(engine, PROMPTS, 2, SAMPLED)
    assert report.prompts == 4 and report.samples == 8
    assert 8 <= report.generated_tokens <= 48 and report.prompts_per_s > 0
