"""tokenizer.json, tokenizer_config.json, special_tokens_map.json: what an uploaded tokenizer may be.

Why so strict: the owner tokenizes held-out prompts with the trainer's tokenizer. Anything in it
that behaves differently on some strings than on others can make an evaluation fail, or run
slower, exactly when a sampled prompt contains a string the trainer guessed, and the status or
latency of the reply then reveals membership (issue 11, hole 1: an added token whose id lay past
the embedding made Evaluate fail on exactly those subsamples, 15 times out of 15). So, on the
uploaded files alone, before anything is charged:

- every token id the tokenizer can produce (model vocabulary, added tokens, post-processor
  specials) must be a row of the model's input embedding, whose row count the caller reads from
  the safetensors header;
- the pipeline is built only from a fixed set of components and parameters. Regular expressions
  are refused unless they are one of a few well-known pre-tokenizer patterns, verbatim: a regex
  Replace can blank, or slow down, exactly the prompts that contain a chosen string;
- BPE dropout is refused: it draws randomness outside the per-row seed rule;
- a model's unknown token must be in its vocabulary: tokenizers raises on an unknown word
  otherwise, i.e. only on prompts that contain one;
- the normalizer may lengthen a text by a bounded factor only (`normalizer_expansion`, at most
  MAX_NORMALIZER_EXPANSION): a chain of literal Replace steps that each multiply a marker
  character (or Unicode normalizations that re-expand what a Replace produced) grew exactly the
  prompts holding a guessed string to 16^k characters, whose tokenizing time (or timeout)
  revealed membership (issue 41). Together with the engines' public character budget per prompt
  (rlvr_core/engines/base.py MAX_CHARS_PER_TOKEN) a row's tokenizing work is bounded by public
  numbers, whatever it holds;
- special tokens named in tokenizer_config.json / special_tokens_map.json must already be tokens
  of tokenizer.json: transformers ADDS a missing one at the next free id, past the embedding;
- tokenizer_config.json may not carry `auto_map`, a `chat_template` (the owner never runs
  trainer-supplied Jinja) or a tokenizer class outside a short list.

Every refusal is a CheckpointValidationError(INVALID_CHECKPOINT) naming the file and field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.refusal import is_int, key_path, refuse, shown

# Split regexes accepted verbatim, as tokenizer.json files hold them (after JSON decoding).
# GPT-2's is the one ByteLevel(use_regex=True) applies internally (a test checks they agree); the
# others were checked against the tokenizer.json files of Llama 3, Qwen2/Qwen3 and GPT-4o ports.
ALLOWED_SPLIT_REGEXES: dict[str, str] = {
    "GPT-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "cl100k / Llama 3": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "Qwen2 / Qwen3": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "o200k / GPT-4o": (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
}

# Tokenizer class names a config may carry. The loader uses PreTrainedTokenizerFast directly, so
# the name never picks code; the list keeps configs to classes that read tokenizer.json.
ALLOWED_TOKENIZER_CLASSES: frozenset[str] = frozenset(
    {
        "PreTrainedTokenizerFast", "TokenizersBackend",  # transformers 5 writes TokenizersBackend
        "Qwen2Tokenizer", "Qwen2TokenizerFast",
        "LlamaTokenizer", "LlamaTokenizerFast",
        "GPT2Tokenizer", "GPT2TokenizerFast",
    }
)

_MAX_TEXT = 16  # replacement texts and affixes: "▁", " ", "##", "</w>"; longer ones inflate prompts
_MAX_LITERAL_PATTERN = 64
_MAX_SEQUENCE_ITEMS = 16
_MAX_SEQUENCE_DEPTH = 3
_SPLIT_BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")
_ADDED_TOKEN_FIELDS = frozenset({"content", "single_word", "lstrip", "rstrip", "normalized", "special"})

Check = Callable[[Any, str], None]

# The most a normalizer may lengthen a text, as a factor on its length in characters: one NFKC
# (or NFKD) step, the largest the Unicode standard allows (18 code points per code point, UAX #15),
# times a lowercasing (3): what the tokenizers of common models use (BERT: NFD x Lowercase = 12;
# Llama 2: Prepend + a 1-to-1 Replace = 1; many: NFKC or NFC alone).
MAX_NORMALIZER_EXPANSION = 54
# Worst-case length factor of each normalizer (code points out per code point in). Replace's is
# computed from its texts; Prepend adds a constant (the text is prepended once, not per character).
_EXPANSION = {"NFC": 3, "NFD": 4, "NFKC": 18, "NFKD": 18, "Lowercase": 3, "StripAccents": 1, "Strip": 1,
              "Prepend": 1}


def _at(where: str) -> str:
    return f"tokenizer.json: {shown(where)}"


# --- value checks ---------------------------------------------------------------------------


def _boolean(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        raise refuse(f"{_at(where)} must be true or false")


def _text(max_chars: int, min_chars: int = 0) -> Check:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, str) or not min_chars <= len(value) <= max_chars:
            raise refuse(f"{_at(where)} must be a string of {min_chars} to {max_chars} characters")

    return check


def _optional(check: Check) -> Check:
    def optional(value: Any, where: str) -> None:
        if value is not None:
            check(value, where)

    return optional


def _choice(*options: str) -> Check:
    def check(value: Any, where: str) -> None:
        if value not in options:
            raise refuse(f"{_at(where)} must be one of {', '.join(options)}")

    return check


def _small_int(low: int, high: int) -> Check:
    def check(value: Any, where: str) -> None:
        if not is_int(value) or not low <= value <= high:
            raise refuse(f"{_at(where)} must be an integer from {low} to {high}")

    return check


def _literal_pattern(value: Any, where: str) -> None:
    """A Replace/Split pattern that is a literal string, never a regex."""
    if isinstance(value, dict) and set(value) == {"Regex"}:
        raise refuse(
            f"{_at(where)} is a regular expression; only a literal {{\"String\": ...}} pattern is allowed "
            "here: a regex can blank, or slow down, exactly the prompts that contain a chosen string"
        )
    if not (isinstance(value, dict) and set(value) == {"String"}):
        raise refuse(f"{_at(where)} must be {{\"String\": \"...\"}}")
    _text(_MAX_LITERAL_PATTERN, min_chars=1)(value["String"], f"{where}.String")


def _split_pattern(value: Any, where: str) -> None:
    """A Split pre-tokenizer pattern: a literal, or one of ALLOWED_SPLIT_REGEXES verbatim."""
    if isinstance(value, dict) and set(value) == {"Regex"}:
        if value["Regex"] not in ALLOWED_SPLIT_REGEXES.values():
            raise refuse(
                f"{_at(where)} is a regular expression that is not one of the allowed well-known "
                f"pre-tokenizer patterns ({', '.join(ALLOWED_SPLIT_REGEXES)}), verbatim; other regexes "
                "can blank, or slow down, exactly the prompts that contain a chosen string"
            )
        return
    _literal_pattern(value, where)


# --- pipeline components --------------------------------------------------------------------


@dataclass(frozen=True)
class _Component:
    fields: dict[str, Check] = field(default_factory=dict)
    required: frozenset[str] = frozenset()


_SHORT_TEXT = _text(_MAX_TEXT)
_ONE_CHAR = _text(1, min_chars=1)
_BYTE_LEVEL = _Component({"add_prefix_space": _boolean, "trim_offsets": _boolean, "use_regex": _boolean})
_METASPACE = _Component(
    {
        "replacement": _ONE_CHAR,
        "prepend_scheme": _choice("always", "never", "first"),
        "split": _boolean,
        "add_prefix_space": _boolean,  # tokenizers < 0.14 wrote these two
        "str_rep": _ONE_CHAR,
    }
)

NORMALIZERS: dict[str, _Component] = {
    "NFC": _Component(),
    "NFD": _Component(),
    "NFKC": _Component(),
    "NFKD": _Component(),
    "Lowercase": _Component(),
    "StripAccents": _Component(),
    "Strip": _Component({"strip_left": _boolean, "strip_right": _boolean}),
    "Prepend": _Component({"prepend": _SHORT_TEXT}, frozenset({"prepend"})),
    "Replace": _Component(
        {"pattern": _literal_pattern, "content": _SHORT_TEXT}, frozenset({"pattern", "content"})
    ),
}

PRE_TOKENIZERS: dict[str, _Component] = {
    "ByteLevel": _BYTE_LEVEL,
    "Metaspace": _METASPACE,
    "Whitespace": _Component(),
    "WhitespaceSplit": _Component(),
    "Punctuation": _Component({"behavior": _choice(*_SPLIT_BEHAVIORS)}),
    "Digits": _Component({"individual_digits": _boolean}),
    "Split": _Component(
        {"pattern": _split_pattern, "behavior": _choice(*_SPLIT_BEHAVIORS), "invert": _boolean},
        frozenset({"pattern", "behavior"}),
    ),
}

DECODERS: dict[str, _Component] = {
    "ByteLevel": _BYTE_LEVEL,
    "Metaspace": _METASPACE,
    "WordPiece": _Component({"prefix": _SHORT_TEXT, "cleanup": _boolean}),
    "BPEDecoder": _Component({"suffix": _SHORT_TEXT}),
    "ByteFallback": _Component(),
    "Fuse": _Component(),
    "Strip": _Component({"content": _ONE_CHAR, "start": _small_int(0, 16), "stop": _small_int(0, 16)}),
    "Replace": _Component(
        {"pattern": _literal_pattern, "content": _SHORT_TEXT}, frozenset({"pattern", "content"})
    ),
}


def _template_pieces(value: Any, where: str) -> None:
    if not isinstance(value, list) or len(value) > _MAX_SEQUENCE_ITEMS:
        raise refuse(f"{_at(where)} must be a list of at most {_MAX_SEQUENCE_ITEMS} pieces")
    for index, piece in enumerate(value):
        here = f"{where}[{index}]"
        if not (isinstance(piece, dict) and len(piece) == 1 and set(piece) <= {"SpecialToken", "Sequence"}):
            raise refuse(f"{_at(here)} must be {{\"SpecialToken\": ...}} or {{\"Sequence\": ...}}")
        body = next(iter(piece.values()))
        if not (isinstance(body, dict) and set(body) == {"id", "type_id"} and isinstance(body["id"], str)):
            raise refuse(f"{_at(here)} must hold exactly a string 'id' and a 'type_id'")
        _small_int(0, 16)(body["type_id"], f"{here}.type_id")


def _template_special_tokens(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise refuse(f"{_at(where)} must be an object")
    for name, entry in value.items():
        here = f"{where}.{name}"
        if not (isinstance(entry, dict) and set(entry) == {"id", "ids", "tokens"}):
            raise refuse(f"{_at(here)} must hold exactly 'id', 'ids' and 'tokens'")
        if not (isinstance(entry["ids"], list) and all(is_int(i) and i >= 0 for i in entry["ids"])):
            raise refuse(f"{_at(here + '.ids')} must be a list of non-negative integers")
        if not (isinstance(entry["tokens"], list) and all(isinstance(t, str) for t in entry["tokens"])):
            raise refuse(f"{_at(here + '.tokens')} must be a list of strings")


def _token_and_id(value: Any, where: str) -> None:
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and is_int(value[1])):
        raise refuse(f"{_at(where)} must be [token, id]")
    if value[1] < 0:
        raise refuse(f"{_at(where)} id must be non-negative")


POST_PROCESSORS: dict[str, _Component] = {
    "ByteLevel": _BYTE_LEVEL,
    "TemplateProcessing": _Component(
        {"single": _template_pieces, "pair": _template_pieces, "special_tokens": _template_special_tokens},
        frozenset({"single", "pair", "special_tokens"}),
    ),
    "RobertaProcessing": _Component(
        {"sep": _token_and_id, "cls": _token_and_id, "trim_offsets": _boolean, "add_prefix_space": _boolean},
        frozenset({"sep", "cls"}),
    ),
    "BertProcessing": _Component({"sep": _token_and_id, "cls": _token_and_id}, frozenset({"sep", "cls"})),
}

# Pipeline stages: (top-level key, allowed components, the key a Sequence lists them under).
_STAGES: tuple[tuple[str, dict[str, _Component], str], ...] = (
    ("normalizer", NORMALIZERS, "normalizers"),
    ("pre_tokenizer", PRE_TOKENIZERS, "pretokenizers"),
    ("post_processor", POST_PROCESSORS, "processors"),
    ("decoder", DECODERS, "decoders"),
)


def _check_component(
    value: Any, where: str, table: dict[str, _Component], sequence_key: str, depth: int = 0
) -> None:
    if not isinstance(value, dict):
        raise refuse(f"{_at(where)} must be an object or null")
    kind = value.get("type")
    if kind == "Sequence":
        items = value.get(sequence_key)
        if set(value) != {"type", sequence_key} or not isinstance(items, list):
            raise refuse(f"{_at(where)}: a Sequence holds exactly 'type' and a list {sequence_key!r}")
        if depth >= _MAX_SEQUENCE_DEPTH or len(items) > _MAX_SEQUENCE_ITEMS:
            raise refuse(
                f"{_at(where)}: Sequences nest at most {_MAX_SEQUENCE_DEPTH} deep and hold at most "
                f"{_MAX_SEQUENCE_ITEMS} items"
            )
        for index, item in enumerate(items):
            _check_component(item, f"{where}.{sequence_key}[{index}]", table, sequence_key, depth + 1)
        return
    component = table.get(kind) if isinstance(kind, str) else None
    if component is None:
        raise refuse(
            f"{_at(where)}: type {shown(kind)} is not allowed; allowed: {', '.join(table)}, Sequence"
        )
    extra = sorted(set(value) - {"type"} - set(component.fields))
    if extra:
        raise refuse(f"{_at(where)}: field {shown(extra[0])} is not allowed in a {kind}")
    missing = sorted(component.required - set(value))
    if missing:
        raise refuse(f"{_at(where)}: a {kind} needs the field {missing[0]!r}")
    for name, check in component.fields.items():
        if name in value:
            check(value[name], f"{where}.{name}")


def normalizer_expansion(normalizer: Any) -> float:
    """The worst-case factor by which a checked normalizer (a component or a Sequence) lengthens a
    text: the product of its steps' factors, a Replace's being len(content) / len(pattern) when
    content is longer (a shorter content only shortens the text where the pattern matched)."""
    if normalizer is None:
        return 1.0
    kind = normalizer["type"]
    if kind == "Sequence":
        total = 1.0
        for step in normalizer["normalizers"]:
            total *= normalizer_expansion(step)
        return total
    if kind == "Replace":
        pattern, content = normalizer["pattern"]["String"], normalizer["content"]
        return max(1.0, len(content) / len(pattern))
    return float(_EXPANSION[kind])


def _check_expansion(normalizer: Any) -> None:
    factor = normalizer_expansion(normalizer)
    if factor > MAX_NORMALIZER_EXPANSION:
        raise refuse(
            f"{_at('normalizer')} can lengthen a text {factor:g}-fold (the product of its steps' worst cases: "
            f"NFKC/NFKD 18, NFD 4, NFC and Lowercase 3, a Replace len(content)/len(pattern)); at most "
            f"{MAX_NORMALIZER_EXPANSION} is allowed: a normalizer that multiplies a guessed string makes "
            "exactly the prompts that hold it slow to tokenize"
        )


def _post_processor_ids(value: Any, where: str) -> list[tuple[str, int]]:
    """(field, id) for every token id a checked post-processor inserts."""
    if value is None:
        return []
    kind = value["type"]
    if kind == "Sequence":
        return [
            found
            for index, item in enumerate(value["processors"])
            for found in _post_processor_ids(item, f"{where}.processors[{index}]")
        ]
    if kind == "TemplateProcessing":
        return [
            (f"{where}.special_tokens.{name}.ids", token_id)
            for name, entry in value["special_tokens"].items()
            for token_id in entry["ids"]
        ]
    if kind in ("RobertaProcessing", "BertProcessing"):
        return [(f"{where}.{part}", value[part][1]) for part in ("sep", "cls")]
    return []


# --- model ------------------------------------------------------------------------------------


def _dropout(value: Any, where: str) -> None:
    is_zero = isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
    if value is not None and not is_zero:
        raise refuse(
            f"{_at(where)} must be null or 0: BPE dropout draws randomness outside the per-row seed rule"
        )


def _merges(value: Any, where: str) -> None:
    if not isinstance(value, list):
        raise refuse(f"{_at(where)} must be a list")
    for merge in value:
        if not (isinstance(merge, str) or (isinstance(merge, list) and len(merge) == 2
                                           and all(isinstance(part, str) for part in merge))):
            raise refuse(f"{_at(where)} entries must be 'a b' strings or [a, b] pairs")


def _any(value: Any, where: str) -> None:
    """Checked by the model's own vocabulary walk."""


MODELS: dict[str, _Component] = {
    "BPE": _Component(
        {
            "dropout": _dropout,
            "unk_token": _optional(_text(1 << 10, min_chars=1)),
            "continuing_subword_prefix": _optional(_SHORT_TEXT),
            "end_of_word_suffix": _optional(_SHORT_TEXT),
            "fuse_unk": _boolean,
            "byte_fallback": _boolean,
            "ignore_merges": _boolean,
            "vocab": _any,
            "merges": _merges,
        },
        frozenset({"vocab", "merges"}),
    ),
    "WordPiece": _Component(
        {
            "unk_token": _text(1 << 10, min_chars=1),
            "continuing_subword_prefix": _SHORT_TEXT,
            "max_input_chars_per_word": _small_int(1, 1 << 20),
            "vocab": _any,
        },
        frozenset({"vocab", "unk_token", "continuing_subword_prefix", "max_input_chars_per_word"}),
    ),
    "WordLevel": _Component(
        {"unk_token": _text(1 << 10, min_chars=1), "vocab": _any}, frozenset({"vocab", "unk_token"})
    ),
    "Unigram": _Component(
        {"unk_id": _small_int(0, 1 << 31), "vocab": _any, "byte_fallback": _boolean},
        frozenset({"vocab", "unk_id"}),
    ),
}

def _model_vocabulary(model: dict[str, Any], rows: int, embedding: str) -> dict[str, int]:
    """token -> id of a checked model; every id below `rows`, the unknown token present."""
    kind = model["type"]
    vocab = model["vocab"]
    if kind == "Unigram":
        if not isinstance(vocab, list):
            raise refuse(f"{_at('model.vocab')} of a Unigram model must be a list of [piece, score]")
        ids: dict[str, int] = {}
        for index, entry in enumerate(vocab):
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                    and isinstance(entry[1], (int, float)) and not isinstance(entry[1], bool)):
                raise refuse(f"{_at(f'model.vocab[{index}]')} must be [piece, score]")
            ids.setdefault(entry[0], index)
        if len(vocab) > rows:
            raise refuse(
                f"{_at('model.vocab')} holds {len(vocab)} pieces, but the input embedding {embedding} has "
                f"only {rows} rows"
            )
        if model["unk_id"] >= len(vocab):
            raise refuse(f"{_at('model.unk_id')} must index model.vocab")
        return ids
    if not isinstance(vocab, dict):
        raise refuse(f"{_at('model.vocab')} must map tokens to ids")
    for token, token_id in vocab.items():
        if not is_int(token_id) or token_id < 0:
            raise refuse(f"{_at('model.vocab')}: token {shown(token)} needs a non-negative integer id")
        if token_id >= rows:
            raise refuse(
                f"{_at('model.vocab')}: token {shown(token)} has id {token_id}, but the input embedding "
                f"{embedding} has only {rows} rows"
            )
    unk = model.get("unk_token")  # required for WordPiece and WordLevel, optional for BPE
    if unk is not None and unk not in vocab:
        raise refuse(
            f"{_at('model.unk_token')} {shown(unk)} is not in model.vocab: tokenizers would then fail on "
            "exactly the prompts that hold an unknown word"
        )
    return dict(vocab)


# --- tokenizer.json ---------------------------------------------------------------------------

_TOP_LEVEL_KEYS = frozenset(
    {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
     "decoder", "model"}
)


def check_tokenizer_json(tokenizer: dict[str, Any], rows: int, embedding: str) -> dict[str, int]:
    """Check a parsed tokenizer.json against an input embedding of `rows` rows (named
    `embedding` in messages). Returns token -> id for every token it defines."""
    extra = sorted(set(tokenizer) - _TOP_LEVEL_KEYS)
    if extra:
        raise refuse(f"tokenizer.json: top-level key {shown(extra[0])} is not allowed")
    if "version" in tokenizer and not isinstance(tokenizer["version"], str):
        raise refuse("tokenizer.json: 'version' must be a string")
    for key in ("truncation", "padding"):
        if tokenizer.get(key) is not None:
            raise refuse(f"tokenizer.json: {key!r} must be null (the owner pads and truncates itself)")
    for key, table, sequence_key in _STAGES:
        if tokenizer.get(key) is not None:
            _check_component(tokenizer[key], key, table, sequence_key)
    _check_expansion(tokenizer.get("normalizer"))
    model = tokenizer.get("model")
    if not isinstance(model, dict) or model.get("type") not in MODELS:
        raise refuse(f"tokenizer.json: 'model.type' must be one of {', '.join(MODELS)}")
    _check_component(model, "model", MODELS, "")
    token_ids = _model_vocabulary(model, rows, embedding)
    for token_id_field, token_id in _post_processor_ids(tokenizer.get("post_processor"), "post_processor"):
        if token_id >= rows:
            raise refuse(
                f"{_at(token_id_field)} inserts id {token_id}, but the input embedding {embedding} has only "
                f"{rows} rows"
            )
    added = tokenizer.get("added_tokens", [])
    if not isinstance(added, list):
        raise refuse("tokenizer.json: 'added_tokens' must be a list")
    for index, entry in enumerate(added):
        where = f"added_tokens[{index}]"
        if not (isinstance(entry, dict) and {"id", "content"} <= set(entry) <= _ADDED_TOKEN_FIELDS | {"id"}):
            allowed = ", ".join(sorted(_ADDED_TOKEN_FIELDS))
            raise refuse(f"{_at(where)} must hold 'id', 'content' and only {allowed}")
        content, token_id = entry["content"], entry["id"]
        if not isinstance(content, str) or not content:
            raise refuse(f"{_at(where + '.content')} must be a non-empty string")
        for flag in _ADDED_TOKEN_FIELDS - {"content"}:
            if flag in entry:
                _boolean(entry[flag], f"{where}.{flag}")
        if not is_int(token_id) or token_id < 0:
            raise refuse(f"{_at(where + '.id')} must be a non-negative integer")
        if token_id >= rows:
            raise refuse(
                f"{_at(where)} ({shown(content)}) has id {token_id}, but the input embedding {embedding} has "
                f"only {rows} rows: every token id must be a row of the embedding"
            )
        token_ids[content] = token_id
    return token_ids


def cross_check_with_tokenizers(text: str, rows: int) -> None:
    """The tokenizers library must load the (already checked) file and agree that every id is
    below `rows`, so a tokenizer can never pass upload and then fail to load."""
    from tokenizers import Tokenizer  # imported here: protocol stays light to import

    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as error:  # noqa: BLE001 - its messages quote the file; name only the type
        kind = type(error).__name__
        raise refuse(f"tokenizer.json: the tokenizers library cannot load it ({kind})") from None
    largest = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if largest >= rows:
        raise refuse(f"tokenizer.json: the tokenizers library sees id {largest}, past {rows} embedding rows")
    _probe_normalizer_growth(tokenizer, json.loads(text))


# Characters with the largest Unicode expansions (NFKD: U+FDFA -> 18 code points; lowercasing U+0130
# -> 2): a normalizer that re-expands what another step produced shows on them.
_EXPANDING_TEXTS = ("\ufdfa", "\u0130", "\u1e9e", "\ufb03")
_PROBE_CHARS = 256


def _probe_texts(tokenizer_json: dict[str, Any]) -> list[str]:
    """Public probe texts built from the tokenizer's own strings: every literal its normalizer
    replaces or writes, every added token, each repeated to _PROBE_CHARS characters, and all of
    them together: the inputs a normalizer aimed at a guessed string grows most on."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key in ("pattern", "content", "prepend"):
                item = value.get(key)
                if isinstance(item, dict) and isinstance(item.get("String"), str):
                    found.append(item["String"])
                elif isinstance(item, str) and item:
                    found.append(item)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(tokenizer_json.get("normalizer"))
    found += [t["content"] for t in tokenizer_json.get("added_tokens", []) if isinstance(t, dict)]
    pieces = [t for t in dict.fromkeys([*found, *_EXPANDING_TEXTS, "a", " "]) if t]
    texts = [(piece * (_PROBE_CHARS // len(piece) + 1))[:_PROBE_CHARS] for piece in pieces]
    return [*texts, "".join(pieces)[: 4 * _PROBE_CHARS]]


def _probe_normalizer_growth(tokenizer: Any, tokenizer_json: dict[str, Any]) -> None:
    """Normalize the probe texts with the tokenizers library itself: none may grow past
    MAX_NORMALIZER_EXPANSION times its length (plus a Prepend's constant): the static bound
    (normalizer_expansion), checked on the library's own behaviour."""
    normalizer = tokenizer.normalizer
    if normalizer is None:
        return
    for text in _probe_texts(tokenizer_json):
        try:
            grown = len(normalizer.normalize_str(text))
        except Exception as error:  # noqa: BLE001 - its messages could quote the file; name the type
            raise refuse(f"tokenizer.json: its normalizer fails on a public probe text ({type(error).__name__})") from None
        if grown > MAX_NORMALIZER_EXPANSION * len(text) + 4 * _MAX_TEXT:
            raise refuse(
                f"tokenizer.json: its normalizer grows a public probe text of {len(text)} characters to {grown}, "
                f"more than {MAX_NORMALIZER_EXPANSION} times: a normalizer that multiplies a guessed string makes "
                "exactly the prompts that hold it slow to tokenize"
            )


# --- tokenizer_config.json and special_tokens_map.json -----------------------------------------


def _positive_number(value: Any, where: str) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
        raise refuse(f"{where} must be a positive number")


def _settings_bool(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        raise refuse(f"{where} must be true or false")


def _settings_choice(*options: str) -> Check:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, str) or value not in options:
            raise refuse(f"{where} must be one of {', '.join(repr(option) for option in options)}")

    return check


def _string_list(value: Any, where: str) -> None:
    if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
        raise refuse(f"{where} must be a list of strings")


def _object(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise refuse(f"{where} must be an object")


def _tokenizer_class(value: Any, where: str) -> None:
    if value is not None and value not in ALLOWED_TOKENIZER_CLASSES:
        raise refuse(
            f"{where} {shown(value)} is not allowed; allowed: {', '.join(sorted(ALLOWED_TOKENIZER_CLASSES))} "
            "(the owner loads tokenizer.json with PreTrainedTokenizerFast whatever this says)"
        )


# Settings that change nothing the owner relies on, with the form transformers accepts at load
# (a wrong form would make loading fail after the charge). Keys ending in "_token" that are not
# listed here are special tokens (transformers 5 treats them so).
TOKENIZER_CONFIG_SETTINGS: dict[str, Check] = {
    "model_max_length": _positive_number,
    "max_len": _positive_number,
    "padding_side": _settings_choice("left", "right"),
    "truncation_side": _settings_choice("left", "right"),
    "model_input_names": _string_list,
    "clean_up_tokenization_spaces": _settings_bool,
    "split_special_tokens": _settings_bool,
    "add_prefix_space": _optional(_settings_bool),
    "add_bos_token": _settings_bool,
    "add_eos_token": _settings_bool,
    "legacy": _optional(_settings_bool),
    "errors": _settings_choice("replace", "strict", "ignore"),
    "spaces_between_special_tokens": _settings_bool,
    "use_default_system_prompt": _settings_bool,
    "do_lower_case": _settings_bool,
    "sp_model_kwargs": _object,  # read by slow sentencepiece tokenizers only
    "is_local": _settings_bool,  # transformers 5 records these when re-saving a loaded tokenizer
    "local_files_only": _settings_bool,
    "backend": _settings_choice("tokenizers"),
    "tokenizer_class": _tokenizer_class,
}
_TOKEN_LISTS = ("additional_special_tokens", "extra_special_tokens", "model_specific_special_tokens")


@dataclass
class _NamedTokens:
    """Special tokens named by tokenizer_config.json / special_tokens_map.json."""

    token_ids: dict[str, int]
    eos: int | None = None

    def resolve(self, value: Any, where: str) -> int | None:
        """The id of a named special token (None for null); refuses a token tokenizer.json lacks."""
        if value is None:
            return None
        if isinstance(value, dict):
            if "content" not in value or not set(value) <= _ADDED_TOKEN_FIELDS | {"__type"}:
                raise refuse(f"{where} must be a token string or an AddedToken object with 'content'")
            value = value["content"]
        if not isinstance(value, str):
            raise refuse(f"{where} must be a token string or an AddedToken object")
        if value not in self.token_ids:
            raise refuse(
                f"{where} {shown(value)} is not a token of tokenizer.json: transformers would add it at a "
                "new id past the embedding; add it to tokenizer.json's added_tokens (resize the embedding)"
            )
        return self.token_ids[value]


def _check_token_settings(
    settings: dict[str, Any], file_name: str, named: _NamedTokens, allowed: dict[str, Check]
) -> None:
    auto_map = key_path(settings, "auto_map")
    if auto_map is not None:
        raise refuse(f"{file_name}: {shown(auto_map)} is not allowed: it asks for custom tokenizer code")
    for key, value in settings.items():
        where = f"{file_name}: {key!r}"
        if key == "chat_template":
            if value is not None:
                raise refuse(
                    f"{where} is not accepted in uploads: the owner never runs trainer-supplied Jinja "
                    "(it prompts with its own fixed template); remove the chat template before uploading"
                )
        elif key in allowed:
            allowed[key](value, where)
        elif key in _TOKEN_LISTS:
            for label, item in _token_list_entries(value, key, where):
                named.resolve(item, f"{file_name}: {shown(label)}")
        elif key == "added_tokens_decoder" and file_name == "tokenizer_config.json":
            _check_added_tokens_decoder(value, named.token_ids)
        elif key.endswith("_token"):
            token_id = named.resolve(value, where)
            if key == "eos_token" and token_id is not None:
                named.eos = token_id
        else:
            raise refuse(f"{where} is not an accepted {file_name} setting")


def _token_list_entries(value: Any, key: str, where: str) -> list[tuple[str, Any]]:
    if value is None:
        return []
    if isinstance(value, dict):
        return [(f"{key}.{name}", item) for name, item in value.items()]
    if isinstance(value, list):
        return [(f"{key}[{index}]", item) for index, item in enumerate(value)]
    raise refuse(f"{where} must be a list of tokens, an object of named tokens, or null")


def _check_added_tokens_decoder(value: Any, token_ids: dict[str, int]) -> None:
    where = "tokenizer_config.json: 'added_tokens_decoder'"
    if not isinstance(value, dict):
        raise refuse(f"{where} must be an object")
    for key, entry in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise refuse(f"{where} keys must be token ids")
        if not (isinstance(entry, dict) and isinstance(entry.get("content"), str)
                and set(entry) <= _ADDED_TOKEN_FIELDS | {"__type"}):
            raise refuse(f"{where} entry {key} must be an AddedToken object with 'content'")
        if token_ids.get(entry["content"]) != int(key):
            raise refuse(
                f"{where} entry {key} ({shown(entry['content'])}) is not tokenizer.json's token with that "
                "id: transformers would add it as a new token past the embedding"
            )


def check_tokenizer_settings(
    tokenizer_config: dict[str, Any] | None,
    special_tokens_map: dict[str, Any] | None,
    token_ids: dict[str, int],
) -> int:
    """Check tokenizer_config.json and special_tokens_map.json (either may be absent) against the
    tokens of tokenizer.json; return the EOS id, which one of them must name."""
    named = _NamedTokens(token_ids)
    if tokenizer_config is not None:
        _check_token_settings(tokenizer_config, "tokenizer_config.json", named, TOKENIZER_CONFIG_SETTINGS)
    if special_tokens_map is not None:
        _check_token_settings(special_tokens_map, "special_tokens_map.json", named, {})
    if named.eos is None:
        raise refuse(
            "tokenizer_config.json: 'eos_token' is missing: name the end-of-sequence token (a token of "
            "tokenizer.json); generation stops at it"
        )
    return named.eos
