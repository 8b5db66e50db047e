"""TransformersEngine with a FixedShape: exact add/remove-one-row invariance, data-independent
forward shapes (time and memory), and failures confined to their row (issue 11, holes 1-3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr_core.engines.base import FixedShape, Generation, SamplingParams, context_length
from rlvr_core.engines.sampling import row_key
from rlvr_core.engines.transformers_engine import TransformersEngine
from rlvr_core.models import load_policy, random_tiny_policy

TEXTS = [f"Calculate {a} + {b}.\nAnswer: {a + b}" for a in range(12) for b in range(12)]
# Lengths from ~8 to ~30 tokens, so rows sit at different padding offsets and positions.
PROMPTS = [f"Calculate {a} + {9 - a}{', please' * (a % 4)}.\nAnswer:" for a in range(10)]
KEYS = [row_key(f"heldout-{index}") for index in range(len(PROMPTS))]
EXTRA, EXTRA_KEY = "Spell 'dog' backwards, then add 3 + 4.\nAnswer:", row_key("extra")
SHAPE = FixedShape(prompt_tokens=32, batch_prompts=3)
MAX_POSITION = 48


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_tiny_policy(tmp_path_factory.mktemp("fixed") / "model", TEXTS, seed=5, max_position=MAX_POSITION)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> TransformersEngine:
    model, tokenizer = load_policy(model_dir)
    return TransformersEngine(model, tokenizer)


def _ids(results: list[list[Generation]]) -> list[list[tuple[int, ...]]]:
    return [[g.completion_ids for g in group] for group in results]


def _forward_shapes(engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Record the (input_ids, attention_mask) shapes of every model call the engine makes."""
    calls: list[tuple] = []
    original = engine._forward

    def recording(input_ids, attention_mask, position_ids, cache):
        calls.append((tuple(input_ids.shape), tuple(attention_mask.shape)))
        return original(input_ids, attention_mask, position_ids, cache)

    monkeypatch.setattr(engine, "_forward", recording)
    return calls


@pytest.mark.parametrize("temperature", [0.7, 1.0, 2.0])
def test_adding_or_removing_one_row_leaves_every_other_row_identical(
    engine: TransformersEngine, temperature: float
) -> None:
    """The DP sensitivity argument needs this exactly: one row changes only its own score."""
    params = SamplingParams(max_new_tokens=6, temperature=temperature, seed=17)
    base = _ids(engine.generate(PROMPTS, 4, params, KEYS, SHAPE))
    assert any(len(set(group)) > 1 for group in base)  # really sampled
    for position in (0, 4, len(PROMPTS)):  # shifts every later row to another batch slot
        prompts = PROMPTS[:position] + [EXTRA] + PROMPTS[position:]
        keys = KEYS[:position] + [EXTRA_KEY] + KEYS[position:]
        grown = _ids(engine.generate(prompts, 4, params, keys, SHAPE))
        assert grown[:position] + grown[position + 1 :] == base
    for position in (0, 5):
        shrunk = _ids(engine.generate(PROMPTS[:position] + PROMPTS[position + 1 :], 4, params,
                                      KEYS[:position] + KEYS[position + 1 :], SHAPE))
        assert shrunk == base[:position] + base[position + 1 :]


def test_positional_keys_would_fail_the_add_one_check(engine: TransformersEngine) -> None:
    """Why row keys exist: with positional keys (the old scheme) one row moves the rows after it."""
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=17)
    base = _ids(engine.generate(PROMPTS, 4, params, shape=SHAPE))
    grown = _ids(engine.generate([EXTRA] + PROMPTS, 4, params, shape=SHAPE))
    assert grown[1:] != base


def test_results_do_not_depend_on_batch_size_or_order(engine: TransformersEngine) -> None:
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    base = _ids(engine.generate(PROMPTS, 2, params, KEYS, SHAPE))
    alone = FixedShape(prompt_tokens=SHAPE.prompt_tokens, batch_prompts=1)
    assert _ids(engine.generate(PROMPTS, 2, params, KEYS, alone)) == base
    assert _ids(engine.generate(PROMPTS[::-1], 2, params, KEYS[::-1], SHAPE)) == base[::-1]


def test_forward_shapes_depend_only_on_the_number_of_prompts(
    engine: TransformersEngine, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Time and memory: same count, different lengths, an empty row and early EOS, same calls."""
    params = SamplingParams(max_new_tokens=5, temperature=1.0, seed=0)
    calls = _forward_shapes(engine, monkeypatch)
    engine.generate(PROMPTS[:7], 2, params, KEYS[:7], SHAPE)
    reference = list(calls)
    width = SHAPE.prompt_tokens
    rows = SHAPE.batch_prompts * 2
    per_batch = [((3, width), (3, width))] + [((rows, 1), (rows, width + step)) for step in range(1, 5)]
    assert reference == per_batch * 3  # 7 prompts -> 3 batches of 3 (2 dummies), all 5 steps

    calls.clear()
    engine.generate(["Hi", "", " ".join(["word"] * 200)] + PROMPTS[3:7], 2, params, KEYS[:7], SHAPE)
    assert calls == reference

    model, tokenizer = load_policy(model_dir)  # a policy that emits EOS at once
    with torch.no_grad():
        head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
        head.weight.copy_(model.get_input_embeddings().weight)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 1e4
    model.lm_head = head
    eos_engine = TransformersEngine(model, tokenizer)
    eos_calls = _forward_shapes(eos_engine, monkeypatch)
    results = eos_engine.generate(PROMPTS[:7], 2, params, KEYS[:7], SHAPE)
    assert all(g.completion_ids == (tokenizer.eos_token_id,) and g.finished for group in results for g in group)
    assert eos_calls == reference  # no early stop
    eos_calls.clear()
    eos_engine.generate(PROMPTS[:7], 2, params, KEYS[:7])  # dynamic batching stops at EOS
    assert len(eos_calls) < len(reference)


def test_prompts_are_left_truncated_to_the_shape(engine: TransformersEngine) -> None:
    long_prompt = " ".join(f"word{i}" for i in range(100)) + "\nAnswer:"
    full = engine.tokenizer(long_prompt, add_special_tokens=False, verbose=False)["input_ids"]
    short = "Hi"
    results = engine.generate([long_prompt, short], 1, SamplingParams(max_new_tokens=4, temperature=0.0),
                              shape=SHAPE)
    assert results[0][0].prompt_ids == tuple(full[-SHAPE.prompt_tokens :])
    assert results[1][0].prompt_ids == tuple(engine.tokenizer(short, add_special_tokens=False)["input_ids"])


def test_shape_must_fit_the_context(engine: TransformersEngine) -> None:
    shape = FixedShape(prompt_tokens=MAX_POSITION - 5, batch_prompts=2)
    with pytest.raises(ValueError, match=r"shape\.prompt_tokens.*max_new_tokens"):
        engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=6), shape=shape)
    shape.check_fits(5, MAX_POSITION)  # exactly fits
    assert context_length(engine.model.config) == MAX_POSITION
    assert context_length({"max_position_embeddings": 48}) == 48
    with pytest.raises(ValueError, match="max_position_embeddings"):
        context_length({"vocab_size": 3})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"prompt_tokens": 0, "batch_prompts": 1}, "prompt_tokens"), ({"prompt_tokens": 8, "batch_prompts": 0},
     "batch_prompts"), ({"prompt_tokens": 8.0, "batch_prompts": 1}, "prompt_tokens")],
)
def test_fixed_shape_fields_are_validated(kwargs, field: str) -> None:
    with pytest.raises(ValueError, match=rf"shape\.{field}"):
        FixedShape(**kwargs)


def test_rows_that_cannot_be_encoded_are_placeholders_in_their_slot(
    engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty, tokenizer-crashing and out-of-vocabulary prompts: no error, same work, others unchanged."""
    params = SamplingParams(max_new_tokens=5, temperature=1.0, seed=9)
    base = _ids(engine.generate(PROMPTS, 2, params, KEYS, SHAPE))
    calls = _forward_shapes(engine, monkeypatch)
    engine.generate(PROMPTS, 2, params, KEYS, SHAPE)
    reference = list(calls)

    real_call = type(engine.tokenizer).__call__

    def hostile_tokenizer(self, text, *args, **kwargs):
        if text == "CRASH":
            raise RuntimeError("tokenizer panicked on CRASH")
        if text == "OOV":
            return {"input_ids": [3, engine.embedding_rows + 7]}
        return real_call(self, text, *args, **kwargs)

    monkeypatch.setattr(type(engine.tokenizer), "__call__", hostile_tokenizer)
    prompts = list(PROMPTS)
    prompts[1], prompts[4], prompts[8] = "", "CRASH", "OOV"
    calls.clear()
    results = engine.generate(prompts, 2, params, KEYS, SHAPE)
    assert calls == reference
    for index in (1, 4, 8):
        assert results[index] == [Generation("", (), (), False)] * 2
    kept = [index for index in range(len(PROMPTS)) if index not in (1, 4, 8)]
    assert [_ids(results)[i] for i in kept] == [base[i] for i in kept]


def test_a_decoding_failure_empties_only_its_row(engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    params = SamplingParams(max_new_tokens=5, temperature=1.0, seed=9)
    base = engine.generate(PROMPTS[:4], 2, params, KEYS[:4], SHAPE)
    poisoned = list(base[2][1].completion_ids)
    real_decode = engine.tokenizer.decode

    def failing_batch_decode(*args, **kwargs):
        raise RuntimeError("batch decode failed")

    def decode(ids, *args, **kwargs):
        if list(ids) == poisoned:
            raise RuntimeError("cannot decode")
        return real_decode(ids, *args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "batch_decode", failing_batch_decode)
    monkeypatch.setattr(engine.tokenizer, "decode", decode)
    results = engine.generate(PROMPTS[:4], 2, params, KEYS[:4], SHAPE)
    assert _ids(results) == _ids(base)
    texts = [[g.text for g in group] for group in results]
    expected = [[g.text for g in group] for group in base]
    expected[2][1] = ""
    assert texts == expected
