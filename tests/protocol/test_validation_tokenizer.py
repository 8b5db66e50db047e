"""Tokenizer files against the embedding: no id past it, only allowlisted pipeline parts.

Each refused form is one way a hostile trainer could make an evaluation fail (or slow down) on
exactly the prompts that contain a guessed string (issue 11, hole 1). Every refusal must be
INVALID_CHECKPOINT and name the file and field.
"""

from __future__ import annotations

import copy
import json

import pytest

from protocol import errors
from protocol.conformance.checkpoints import (
    tiny_checkpoint_files,
    tokenizer_with_token_past_embedding,
    with_token_past_embedding,
)
from protocol.tokenizer_rules import ALLOWED_SPLIT_REGEXES
from protocol.validation import (
    CheckpointValidationError,
    EmbeddingShape,
    embedding_shape,
    validate_tokenizer_files,
)

ROWS = 300  # the conformance tiny checkpoint's embedding rows (= its vocabulary)
EMBEDDING = EmbeddingShape("model.embed_tokens.weight", ROWS, 32)


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return {f.name: f.data for f in tiny_checkpoint_files(seed=0)}


@pytest.fixture()
def tokenizer(files) -> dict:
    return json.loads(files["tokenizer.json"])


@pytest.fixture()
def settings(files) -> dict:
    return json.loads(files["tokenizer_config.json"])


def _encode(value: dict) -> bytes:
    return json.dumps(value).encode("utf-8")


def _check(tokenizer: dict, settings: dict | None = None, special: dict | None = None, rows: int = ROWS):
    embedding = EmbeddingShape(EMBEDDING.tensor, rows, EMBEDDING.width)
    default = {"eos_token": "<|endoftext|>"}
    return validate_tokenizer_files(
        _encode(tokenizer),
        embedding,
        _encode(settings if settings is not None else default),
        None if special is None else _encode(special),
    )


def _refused(match: str, tokenizer: dict, settings: dict | None = None, special: dict | None = None) -> str:
    with pytest.raises(CheckpointValidationError, match=match) as caught:
        _check(tokenizer, settings, special)
    assert caught.value.reason == errors.INVALID_CHECKPOINT
    return caught.value.message


def _added(content: str, token_id: int) -> dict:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": False,
    }


def test_the_suites_tokenizer_passes(tokenizer, settings) -> None:
    summary = _check(tokenizer, settings)
    assert (summary.token_count, summary.eos_token_id) == (ROWS, 0)


def test_the_projects_own_tokenizer_passes(tmp_path) -> None:
    """rlvr_core's tokenizer: BPE + Sequence[Digits(individual), ByteLevel] + ByteLevel decoder."""
    from rlvr_core.models.tokenizer import train_tokenizer

    trained = train_tokenizer(["Calculate 12 + 7.\nAnswer: 19", "hello world"], vocab_size=300)
    trained.save_pretrained(str(tmp_path))
    parsed = json.loads((tmp_path / "tokenizer.json").read_text())
    assert parsed["pre_tokenizer"]["pretokenizers"][0]["type"] == "Digits"
    summary = validate_tokenizer_files(
        (tmp_path / "tokenizer.json").read_bytes(),
        EmbeddingShape(EMBEDDING.tensor, len(trained), 32),
        (tmp_path / "tokenizer_config.json").read_bytes(),
    )
    assert summary.eos_token_id == trained.eos_token_id


# --- ids against the embedding -------------------------------------------------------------


def test_an_added_token_past_the_embedding_is_refused(files) -> None:
    """The reproduced attack: a token for a guessed string whose id is one past the last row."""
    data = tokenizer_with_token_past_embedding(files["tokenizer.json"], ROWS, "GUESSED-SECRET")
    with pytest.raises(CheckpointValidationError) as caught:
        validate_tokenizer_files(data, EMBEDDING, files["tokenizer_config.json"])
    assert caught.value.reason == errors.INVALID_CHECKPOINT
    message = caught.value.message
    assert "tokenizer.json" in message and "added_tokens[1]" in message
    assert f"id {ROWS}" in message and f"{ROWS} rows" in message and "model.embed_tokens.weight" in message
    # The whole-checkpoint builder the conformance suite uploads produces the same file.
    built = {
        f.name: f.data for f in with_token_past_embedding(tiny_checkpoint_files(seed=0), "GUESSED-SECRET")
    }
    assert built["tokenizer.json"] == data


def test_an_added_token_inside_the_embedding_is_accepted(tokenizer) -> None:
    tokenizer["model"]["vocab"].pop(max(tokenizer["model"]["vocab"], key=tokenizer["model"]["vocab"].get))
    tokenizer["model"]["merges"] = []  # merges would name the removed token
    tokenizer["added_tokens"].append(_added("<|spare|>", ROWS - 1))
    assert _check(tokenizer).token_count == ROWS


def test_a_vocab_id_past_the_embedding_is_refused(tokenizer) -> None:
    token = next(iter(tokenizer["model"]["vocab"]))
    tokenizer["model"]["vocab"][token] = ROWS + 5
    _refused(
        f"'model.vocab': token .* has id {ROWS + 5}, but the input embedding .* has only {ROWS} rows",
        tokenizer,
    )


def test_a_smaller_embedding_than_the_vocabulary_is_refused(tokenizer) -> None:
    with pytest.raises(CheckpointValidationError, match="has only 200 rows"):
        _check(tokenizer, rows=200)


def test_a_post_processor_id_past_the_embedding_is_refused(tokenizer) -> None:
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [ROWS], "tokens": ["<s>"]}},
    }
    _refused(r"post_processor.special_tokens.<s>.ids' inserts id 300", tokenizer)


@pytest.mark.parametrize(
    "shapes, match",
    [
        (
            {"model.embed_tokens.weight": (300, 32), "lm_head.weight": (310, 32)},
            "output head 'lm_head.weight'",
        ),
        ({"model.embed_tokens.weight": (300, 32), "lm_head.weight": (300, 16)}, "output head"),
        ({"model.norm.weight": (32,)}, "no input embedding 'model.embed_tokens.weight'"),
        ({"model.embed_tokens.weight": (300,)}, "non-empty matrix"),
    ],
)
def test_embedding_and_head_must_agree(shapes, match) -> None:
    with pytest.raises(CheckpointValidationError, match=match) as caught:
        embedding_shape("Qwen2ForCausalLM", shapes)
    assert caught.value.reason == errors.INVALID_CHECKPOINT


def test_embedding_names_per_architecture() -> None:
    assert embedding_shape("LlamaForCausalLM", {"model.embed_tokens.weight": (10, 4)}).rows == 10
    gpt2 = {"transformer.wte.weight": (12, 4), "transformer.h.0.ln_1.weight": (4,)}
    assert embedding_shape("GPT2LMHeadModel", gpt2).tensor == "transformer.wte.weight"
    # GPT-2's original hub weights have no "transformer." prefix; the loader adds it.
    assert embedding_shape("GPT2LMHeadModel", {"wte.weight": (12, 4), "h.0.ln_1.weight": (4,)}).rows == 12


# --- the pipeline allowlist ------------------------------------------------------------------


def test_a_regex_replace_normalizer_is_refused(tokenizer) -> None:
    tokenizer["normalizer"] = {"type": "Replace", "pattern": {"Regex": "SECRET.*"}, "content": ""}
    message = _refused("'normalizer.pattern' is a regular expression", tokenizer)
    assert "SECRET" not in message
    tokenizer["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    _check(tokenizer)  # a literal Replace is fine


def test_a_regex_inside_a_normalizer_sequence_is_refused(tokenizer) -> None:
    tokenizer["normalizer"] = {
        "type": "Sequence",
        "normalizers": [{"type": "NFC"}, {"type": "Replace", "pattern": {"Regex": "a+"}, "content": "b"}],
    }
    _refused(r"'normalizer.normalizers\[1\].pattern' is a regular expression", tokenizer)


def test_a_split_regex_outside_the_allowlist_is_refused(tokenizer) -> None:
    tokenizer["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": False},
            tokenizer["pre_tokenizer"],
        ],
    }
    _refused(
        r"'pre_tokenizer.pretokenizers\[0\].pattern' is a regular expression that is not one of", tokenizer
    )


@pytest.mark.parametrize("name", sorted(ALLOWED_SPLIT_REGEXES))
def test_each_allowlisted_split_regex_is_accepted_and_loads(tokenizer, name) -> None:
    tokenizer["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {"Regex": ALLOWED_SPLIT_REGEXES[name]},
                "behavior": "Isolated",
                "invert": False,
            },
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ],
    }
    _check(tokenizer)  # the cross-check loads it with the tokenizers library


def test_the_gpt2_regex_is_the_one_bytelevel_applies() -> None:
    from tokenizers import Regex, pre_tokenizers

    builtin = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    explicit = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(ALLOWED_SPLIT_REGEXES["GPT-2"]), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    for text in ["Hello world's 42  x\n\n  yes!!", "I'll  \u00fcn\u00efcode 12345 \t\tend  ", "a'LL b'd"]:
        assert builtin.pre_tokenize_str(text) == explicit.pre_tokenize_str(text)


@pytest.mark.parametrize("dropout", [0.1, 1.0, True])
def test_bpe_dropout_is_refused(tokenizer, dropout) -> None:
    tokenizer["model"]["dropout"] = dropout
    _refused("'model.dropout' must be null or 0: BPE dropout draws randomness", tokenizer)


@pytest.mark.parametrize("dropout", [None, 0, 0.0])
def test_bpe_without_dropout_is_accepted(tokenizer, dropout) -> None:
    tokenizer["model"]["dropout"] = dropout
    _check(tokenizer)


@pytest.mark.parametrize(
    "stage, component, match",
    [
        (
            "normalizer",
            {"type": "Precompiled", "precompiled_charsmap": "AAAA"},
            "type 'Precompiled' is not allowed",
        ),
        ("normalizer", {"type": "BertNormalizer"}, "type 'BertNormalizer' is not allowed"),
        ("normalizer", {"type": "NFC", "extra": 1}, "field 'extra' is not allowed in a NFC"),
        (
            "normalizer",
            {"type": "Replace", "pattern": {"String": "a"}, "content": "x" * 17},
            "'normalizer.content'",
        ),
        (
            "normalizer",
            {"type": "Replace", "pattern": {"String": ""}, "content": "x"},
            "'normalizer.pattern.String'",
        ),
        ("normalizer", {"type": "Prepend"}, "needs the field 'prepend'"),
        ("pre_tokenizer", {"type": "UnicodeScripts"}, "type 'UnicodeScripts' is not allowed"),
        ("pre_tokenizer", {"type": "Split", "pattern": {"String": "x"}, "behavior": "Sideways"}, "behavior"),
        (
            "decoder",
            {"type": "Replace", "pattern": {"Regex": "x"}, "content": ""},
            "'decoder.pattern' is a regular",
        ),
        ("decoder", {"type": "CTC"}, "type 'CTC' is not allowed"),
        ("post_processor", {"type": "Custom"}, "type 'Custom' is not allowed"),
        (
            "normalizer",
            {
                "type": "Sequence",
                "normalizers": [
                    {
                        "type": "Sequence",
                        "normalizers": [
                            {"type": "Sequence", "normalizers": [{"type": "Sequence", "normalizers": []}]}
                        ],
                    }
                ],
            },
            "nest at most",
        ),
        ("normalizer", "NFC", "must be an object"),
    ],
)
def test_components_outside_the_allowlist_are_refused(tokenizer, stage, component, match) -> None:
    tokenizer[stage] = component
    _refused(match, tokenizer)


def test_the_usual_hub_pipelines_are_accepted(tokenizer) -> None:
    """Llama-2 / Mistral style (SentencePiece BPE with byte fallback) and a BERT-like processor."""
    llama2 = copy.deepcopy(tokenizer)
    llama2["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        ],
    }
    llama2["pre_tokenizer"] = None
    llama2["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    llama2["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {
                "type": "RobertaProcessing",
                "sep": ["<|endoftext|>", 0],
                "cls": ["<|endoftext|>", 0],
                "trim_offsets": True,
                "add_prefix_space": False,
            },
        ],
    }
    llama2["model"]["byte_fallback"] = True
    _check(llama2)
    metaspace = copy.deepcopy(tokenizer)
    metaspace["pre_tokenizer"] = {
        "type": "Metaspace",
        "replacement": "\u2581",
        "prepend_scheme": "first",
        "split": False,
    }
    metaspace["decoder"] = {
        "type": "Metaspace",
        "replacement": "\u2581",
        "prepend_scheme": "first",
        "split": False,
    }
    _check(metaspace)


@pytest.mark.parametrize("key", ["truncation", "padding"])
def test_truncation_and_padding_must_be_null(tokenizer, key) -> None:
    tokenizer[key] = {"max_length": 8, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}
    _refused(f"'{key}' must be null", tokenizer)


def test_unknown_top_level_keys_are_refused(tokenizer) -> None:
    tokenizer["auto_map"] = {"AutoTokenizer": "x.Tok"}
    _refused("top-level key 'auto_map' is not allowed", tokenizer)


# --- unknown tokens: tokenizers raises on exactly the prompts with an unknown word ---------------


def test_a_bpe_unk_token_missing_from_the_vocab_is_refused(tokenizer) -> None:
    tokenizer["model"]["unk_token"] = "<unk>"
    _refused("'model.unk_token' '<unk>' is not in model.vocab", tokenizer)


def test_a_wordpiece_unk_token_must_be_in_the_vocab() -> None:
    model = {
        "type": "WordPiece",
        "continuing_subword_prefix": "##",
        "max_input_chars_per_word": 100,
        "vocab": {"<|endoftext|>": 0, "a": 1},
    }
    wordpiece = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": model,
    }
    _refused("needs the field 'unk_token'", wordpiece)  # tokenizers cannot load it without one
    model["unk_token"] = "[UNK]"
    _refused("'model.unk_token' '\\[UNK\\]' is not in model.vocab", wordpiece)
    model["vocab"]["[UNK]"] = 2
    assert _check(wordpiece).token_count == 3


def test_a_unigram_model_needs_an_unknown_id() -> None:
    unigram = {
        "version": "1.0",
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "Unigram", "vocab": [["<|endoftext|>", 0.0], ["a", -1.0]], "byte_fallback": False},
    }
    _refused("needs the field 'unk_id'", unigram)
    unigram["model"]["unk_id"] = 5
    _refused("'model.unk_id' must index model.vocab", unigram)
    unigram["model"]["unk_id"] = 1
    assert _check(unigram).token_count == 2


def test_a_file_the_tokenizers_library_cannot_load_is_refused(tokenizer) -> None:
    tokenizer["model"]["merges"] = [["not-a-token", "neither"]]
    _refused("the tokenizers library cannot load it", tokenizer)


# --- tokenizer_config.json and special_tokens_map.json ---------------------------------------


def test_a_chat_template_is_refused(tokenizer, settings) -> None:
    settings["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}"
    message = _refused(
        "tokenizer_config.json: 'chat_template' is not accepted in uploads", tokenizer, settings
    )
    assert "Jinja" in message and "messages" not in message


@pytest.mark.parametrize(
    "extra",
    [
        {"auto_map": {"AutoTokenizer": ["tok.EvilTokenizer", None]}},
        {"model_max_length": 128, "sp_model_kwargs": {"nested": {"auto_map": {"AutoTokenizer": "x.Tok"}}}},
    ],
)
def test_auto_map_anywhere_in_tokenizer_config_is_refused(tokenizer, settings, extra) -> None:
    _refused("tokenizer_config.json: .*auto_map.* is not allowed", tokenizer, {**settings, **extra})


def test_a_tokenizer_class_outside_the_allowlist_is_refused(tokenizer, settings) -> None:
    _refused(
        "'tokenizer_class' 'EvilTokenizer' is not allowed",
        tokenizer,
        {**settings, "tokenizer_class": "EvilTokenizer"},
    )
    for name in ("TokenizersBackend", "Qwen2TokenizerFast", "LlamaTokenizerFast", "GPT2TokenizerFast"):
        _check(tokenizer, {**settings, "tokenizer_class": name})


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"eos_token": "<|im_end|>"}, "'eos_token' '<|im_end|>' is not a token of tokenizer.json"),
        ({"pad_token": {"content": "<|pad|>", "__type": "AddedToken"}}, "'pad_token' '<|pad|>'"),
        ({"boi_token": "<|boi|>"}, "'boi_token'"),  # transformers 5 treats any *_token key as special
        ({"extra_special_tokens": ["<|a|>"]}, r"'extra_special_tokens\[0\]'"),
        ({"extra_special_tokens": {"image_token": "<|img|>"}}, "'extra_special_tokens.image_token'"),
        ({"additional_special_tokens": ["<|a|>"]}, r"'additional_special_tokens\[0\]'"),
        ({"model_specific_special_tokens": {"x_token": "<|x|>"}}, "'model_specific_special_tokens.x_token'"),
        ({"mask_token": 5}, "'mask_token' must be a token string"),
    ],
)
def test_special_tokens_must_already_be_tokens(tokenizer, settings, extra, match) -> None:
    """transformers ADDS a named special token it cannot find, at the next id: past the embedding."""
    message = _refused(match, tokenizer, {**settings, **extra})
    assert message.startswith("tokenizer_config.json: ")


def test_special_tokens_map_is_checked_too(tokenizer, settings) -> None:
    _refused(
        "special_tokens_map.json: 'pad_token' '<|padx|>' is not a token",
        tokenizer,
        settings,
        {"pad_token": "<|padx|>"},
    )
    _refused("special_tokens_map.json: 'chat' is not an accepted", tokenizer, settings, {"chat": "x"})
    _check(tokenizer, settings, {"eos_token": "<|endoftext|>", "additional_special_tokens": []})


def test_added_tokens_decoder_must_match_tokenizer_json(tokenizer, settings) -> None:
    entry = {
        "content": "<|endoftext|>",
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }
    _check(tokenizer, {**settings, "added_tokens_decoder": {"0": entry}})
    _refused(
        "'added_tokens_decoder' entry 0 \\('<\\|other\\|>'\\) is not tokenizer.json's token",
        tokenizer,
        {**settings, "added_tokens_decoder": {"0": {**entry, "content": "<|other|>"}}},
    )
    _refused(
        "'added_tokens_decoder' entry 400", tokenizer, {**settings, "added_tokens_decoder": {"400": entry}}
    )


def test_an_eos_token_is_required(tokenizer, settings) -> None:
    settings.pop("eos_token")
    _refused("'eos_token' is missing", tokenizer, settings)
    _check(tokenizer, settings, {"eos_token": "<|endoftext|>"})  # special_tokens_map.json may name it


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"padding_side": "middle"}, "'padding_side' must be one of"),
        ({"model_max_length": -1}, "'model_max_length' must be a positive number"),
        (
            {"tokenizer_file": "/etc/other.json"},
            "'tokenizer_file' is not an accepted tokenizer_config.json setting",
        ),
        ({"trust_remote_code": True}, "'trust_remote_code' is not an accepted"),
        ({"backend": "sentencepiece"}, "'backend' must be one of"),
    ],
)
def test_tokenizer_settings_need_the_form_transformers_loads(tokenizer, settings, extra, match) -> None:
    _refused(match, tokenizer, {**settings, **extra})


def test_messages_do_not_echo_long_contents(files) -> None:
    secret = "S" * 80 + "-HIDDEN-TAIL-OF-A-LONG-GUESSED-STRING"  # names are cut at 80 characters
    data = tokenizer_with_token_past_embedding(files["tokenizer.json"], ROWS, secret)
    with pytest.raises(CheckpointValidationError) as caught:
        validate_tokenizer_files(data, EMBEDDING, files["tokenizer_config.json"])
    assert "HIDDEN-TAIL" not in caught.value.message


def test_what_passes_loads_in_transformers_without_new_ids(tmp_path, tokenizer, settings) -> None:
    """In sync with transformers: settings that pass (special tokens that exist, a matching
    added_tokens_decoder, custom *_token names) give a loaded tokenizer whose every id is a row."""
    from transformers import PreTrainedTokenizerFast

    tokenizer["added_tokens"].append(_added("<|spare|>", ROWS - 1))
    tokenizer["model"]["vocab"] = {t: i for t, i in tokenizer["model"]["vocab"].items() if i != ROWS - 1}
    tokenizer["model"]["merges"] = []
    entry = {
        "content": "<|spare|>",
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }
    settings.update(
        pad_token="<|spare|>",
        boi_token="<|spare|>",
        extra_special_tokens=["<|spare|>"],
        added_tokens_decoder={str(ROWS - 1): entry},
    )
    _check(tokenizer, settings, {"eos_token": "<|endoftext|>"})
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    loaded = PreTrainedTokenizerFast.from_pretrained(str(tmp_path), local_files_only=True)
    assert len(loaded) == ROWS and max(loaded.get_vocab().values()) == ROWS - 1
    assert loaded.pad_token_id == ROWS - 1 and loaded.eos_token_id == 0


# -- issue 41: a normalizer that makes exactly the prompts holding a guessed string costly ----------------

def _amplifier(secret: str, steps: int) -> dict:
    """The attack: the guessed string becomes a control character, then each step multiplies it 16x."""
    return {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": secret}, "content": "\u0001"},
        *[{"type": "Replace", "pattern": {"String": "\u0001"}, "content": "\u0001" * 16} for _ in range(steps)],
    ]}


@pytest.mark.parametrize("steps", [2, 5])
def test_a_normalizer_that_multiplies_a_guessed_string_is_refused(tokenizer, steps) -> None:
    tokenizer["normalizer"] = _amplifier("zqj-secret", steps)
    message = _refused("can lengthen a text", tokenizer)
    assert "zqj-secret" not in message  # the refusal names the bound, never the pattern


def test_unicode_normalizations_that_re_expand_a_replacement_are_refused(tokenizer) -> None:
    """Each step alone is ordinary; NFKD turns U+FDFA into 18 characters, and a 1-to-1 Replace can make
    U+FDFA again: chained, the product of their factors is what counts."""
    tokenizer["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFKD"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\ufdfa"}, {"type": "NFKD"},
    ]}
    _refused("can lengthen a text 324-fold", tokenizer)


@pytest.mark.parametrize("normalizer", [
    {"type": "NFKC"},
    {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"}, {"type": "StripAccents"}]},
    {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
    {"type": "Replace", "pattern": {"String": "``"}, "content": "\""},
])
def test_the_usual_normalizers_stay_within_the_bound(tokenizer, normalizer) -> None:
    from protocol.tokenizer_rules import MAX_NORMALIZER_EXPANSION, normalizer_expansion

    tokenizer["normalizer"] = normalizer
    assert normalizer_expansion(normalizer) <= MAX_NORMALIZER_EXPANSION
    _check(tokenizer)


def test_the_library_probe_refuses_what_the_static_bound_would_miss(tokenizer, monkeypatch) -> None:
    """The second line: the tokenizers library itself normalizes public probe texts built from the
    tokenizer's own strings; growth past the bound is refused even if the static analysis were wrong."""
    from protocol import tokenizer_rules

    monkeypatch.setattr(tokenizer_rules, "normalizer_expansion", lambda normalizer: 1.0)  # a wrong analysis
    tokenizer["normalizer"] = _amplifier("zqj-secret", 3)
    _refused("grows a public probe text", tokenizer)


def test_the_character_budget_bounds_what_an_engine_tokenizes() -> None:
    from rlvr_core.engines.base import MAX_CHARS_PER_TOKEN, completion_budget, prompt_budget

    long = "x" * 10_000 + "What is 2 + 3?\nAnswer:"
    kept = prompt_budget(long, 16)
    assert len(kept) == MAX_CHARS_PER_TOKEN * 16 and kept.endswith("Answer:")
    assert prompt_budget("short", 16) == "short"
    assert completion_budget(" 12" * 1000, 4) == (" 12" * 1000)[: MAX_CHARS_PER_TOKEN * 4]
