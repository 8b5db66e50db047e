"""Tokenizer training and the cached, deterministic tiny-policy build (rlvr_core/models)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlvr_core.models import TinyPolicySpec, build_tiny_policy, load_policy, tiny_policy, train_tokenizer

PAIRS = [(f"Calculate {a} + {b}.\nAnswer:", f" {a + b}") for a in range(15) for b in range(15)]
TEXTS = [prompt + completion for prompt, completion in PAIRS]
# Small enough that a build with a few SFT steps takes well under a second.
TINY = TinyPolicySpec(
    vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
    max_position=64, sft_steps=4, sft_batch_size=8, sft_lr=1e-2, seed=3,
)


def test_tokenizer_roundtrips_unseen_text_and_has_the_right_specials() -> None:
    tokenizer = train_tokenizer(TEXTS, vocab_size=300, seed=0)
    unseen = "Ünïcödé ✓ 🚀 tabs\tand\nnewlines: -12345.678 <b>{x}</b>"
    ids = tokenizer(unseen, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == unseen
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 0
    assert tokenizer.padding_side == "left"
    assert tokenizer.bos_token is None
    assert tokenizer("1", add_special_tokens=False)["input_ids"] != tokenizer("12", add_special_tokens=False)["input_ids"]
    assert len(tokenizer(" 1234", add_special_tokens=False)["input_ids"]) == 5  # space + one token per digit
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == unseen


def test_tokenizer_training_is_deterministic() -> None:
    first = train_tokenizer(TEXTS, vocab_size=300).backend_tokenizer.to_str()
    second = train_tokenizer(TEXTS, vocab_size=300).backend_tokenizer.to_str()
    assert first == second


def test_tokenizer_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(TEXTS, vocab_size=100)
    with pytest.raises(ValueError, match="texts"):
        train_tokenizer([], vocab_size=300)


@pytest.mark.parametrize(
    ("field", "value"),
    [("architecture", "gpt2"), ("num_heads", 3), ("num_kv_heads", 3), ("vocab_size", 10), ("sft_lr", 0.0),
     ("sft_steps", -1), ("hidden_size", 0), ("hidden_size", "128"), ("num_layers", 2.0), ("seed", True)],
)
def test_spec_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        replace(TINY, **{field: value})


def test_build_is_deterministic_cached_and_leaves_rng_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng_before = torch.random.get_rng_state()
    first = build_tiny_policy(TINY, TEXTS, PAIRS, tmp_path / "a", progress=False)
    second = build_tiny_policy(TINY, TEXTS, PAIRS, tmp_path / "b", progress=False)
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert first.name == second.name  # content key: same inputs, same name
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes()

    def no_rebuild(*args, **kwargs):
        raise AssertionError("a cache hit must not rebuild")

    monkeypatch.setattr(tiny_policy, "_build_into", no_rebuild)
    assert build_tiny_policy(TINY, TEXTS, PAIRS, tmp_path / "a", progress=False) == first

    record = json.loads((tmp_path / "a" / f"{first.name}.build.json").read_text())
    assert record["spec"]["seed"] == TINY.seed and record["num_parameters"] > 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [first.name, f"{first.name}.build.json"]


def test_cache_key_changes_with_every_input() -> None:
    base = tiny_policy.cache_key(TINY, TEXTS, PAIRS)
    assert tiny_policy.cache_key(replace(TINY, seed=4), TEXTS, PAIRS) != base
    assert tiny_policy.cache_key(TINY, TEXTS[:-1], PAIRS) != base
    assert tiny_policy.cache_key(TINY, TEXTS, PAIRS[:-1]) != base
    assert tiny_policy.cache_key(TINY, TEXTS, PAIRS) == base


def test_crashed_build_leaves_no_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash during SFT")

    monkeypatch.setattr(tiny_policy, "supervised_warmup", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_tiny_policy(TINY, TEXTS, PAIRS, tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_sft_warmup_learns_the_pairs(tmp_path: Path) -> None:
    spec = replace(TINY, sft_steps=40, sft_batch_size=16)
    path = build_tiny_policy(spec, TEXTS, PAIRS, tmp_path, progress=False)
    record = json.loads((tmp_path / f"{path.name}.build.json").read_text())
    assert record["sft_loss_last"] < 0.6 * record["sft_loss_first"]
    model, tokenizer = load_policy(path)
    assert model.config.max_position_embeddings == spec.max_position
    assert model.config.eos_token_id == tokenizer.eos_token_id


def test_llama_architecture_builds_and_loads(tmp_path: Path) -> None:
    path = build_tiny_policy(replace(TINY, architecture="llama", sft_steps=1), TEXTS, PAIRS, tmp_path, progress=False)
    model, _ = load_policy(path)
    assert type(model).__name__ == "LlamaForCausalLM"


def test_random_tiny_policy_accepts_overrides(tmp_path: Path) -> None:
    path = tiny_policy.random_tiny_policy(tmp_path / "m", TEXTS, seed=1, hidden_size=16, num_heads=2, num_kv_heads=1)
    model, _ = load_policy(path)
    assert model.config.hidden_size == 16 and model.config.num_hidden_layers == 2
