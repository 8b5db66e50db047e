"""The generation-engine interface shared by trainer rollouts and owner evaluation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

MAX_CHARS_PER_TOKEN = 8
"""The public character budget of a text an engine tokenizes: a prompt kept to its last
MAX_CHARS_PER_TOKEN x (tokens it may keep) characters before tokenizing (its end, which
left-truncation keeps), a completion to its first MAX_CHARS_PER_TOKEN x completion tokens. So the
work of tokenizing one row is bounded by public numbers whatever the row holds, together with the
bound on an uploaded normalizer's expansion (protocol/tokenizer_rules.py, issue 41). Ordinary text
runs 3-5 characters a token, so only a prompt far longer than its kept tokens is cut differently."""


def prompt_budget(text: str, room: int) -> str:
    """`text` cut to its last MAX_CHARS_PER_TOKEN * room characters (the part tokenizing may keep)."""
    return text[-MAX_CHARS_PER_TOKEN * room :] if len(text) > MAX_CHARS_PER_TOKEN * room else text


def completion_budget(text: str, tokens: int) -> str:
    """`text` cut to its first MAX_CHARS_PER_TOKEN * tokens characters."""
    return text[: MAX_CHARS_PER_TOKEN * tokens]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class FixedShape:
    """A public, data-independent shape for every forward pass (used by the target owner).

    Every prompt is left-truncated or left-padded to exactly `prompt_tokens` tokens, every
    batch holds exactly `batch_prompts` prompts (with all their samples; the last batch is
    filled with dummy rows whose outputs are dropped), and decoding runs all max_new_tokens
    steps. So time and memory depend only on (number of prompts, shape, public params), and a
    row's computation does not depend on its batch-mates.
    """

    prompt_tokens: int
    batch_prompts: int

    def __post_init__(self) -> None:
        for field_name in ("prompt_tokens", "batch_prompts"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"shape.{field_name} must be an int >= 1, got {value!r}")

    def check_fits(self, max_new_tokens: int, context_length: int) -> None:
        """Raise ValueError when prompt_tokens + max_new_tokens exceeds the model's context.

        Public inputs only, so the owner can run it before charging a request.
        """
        if self.prompt_tokens + max_new_tokens > context_length:
            raise ValueError(
                f"shape.prompt_tokens ({self.prompt_tokens}) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"model's {context_length} positions; lower one of them"
            )


def context_length(config: Any) -> int:
    """Context length (prompt + completion) of a model config: an object or a config.json dict."""
    get = config.get if isinstance(config, dict) else lambda name: getattr(config, name, None)
    value = get("max_position_embeddings") or get("n_positions")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("model config has no valid max_position_embeddings / n_positions")
    return value


@dataclass(frozen=True)
class Generation:
    """One completion. A prompt the engine could not encode (it tokenizes to nothing, the
    tokenizer fails on it, or an id lies outside the embedding) gives `num_samples`
    generations with empty prompt_ids and completion_ids and text "": see `encoded`."""

    text: str                    # decoded completion, special tokens stripped ("" if decoding failed)
    prompt_ids: tuple[int, ...]  # token ids of the rendered prompt, as fed (after truncation)
    completion_ids: tuple[int, ...]  # generated ids, including EOS when it was produced
    finished: bool               # True when EOS was produced before max_new_tokens

    @property
    def encoded(self) -> bool:
        """False for the placeholder of a prompt that could not be encoded (score it 0)."""
        return bool(self.prompt_ids)


class GenerationEngine(ABC):
    """Generates completions. Implementations are registered by name in engines/registry.py."""

    name: str = ""

    @abstractmethod
    def generate(
        self,
        prompts: list[str],
        num_samples: int,
        params: SamplingParams,
        row_keys: Sequence[int] | None = None,
        shape: FixedShape | None = None,
    ) -> list[list[Generation]]:
        """Return, for each prompt, `num_samples` generations (shape: [len(prompts)][num_samples]).

        Row r's random numbers depend only on (params.seed, row_keys[r], sample index)
        (`sampling.row_seed`); `row_keys=None` uses positional keys 0..n-1. The same seed gives
        the same generations, so candidates evaluated with one seed are paired. With `shape`,
        every forward pass has that fixed shape (see FixedShape). A prompt that cannot be
        encoded never raises: it gets placeholder generations (Generation.encoded is False).
        """

    def sync_weights(self) -> None:
        """Called by the trainer after each optimizer step (vLLM pushes weights here)."""


    # --- teacher forcing (the owner's difference releases; rlvr_core/differences.py) -------------

    teacher_forcing: ClassVar[bool] = False
    """Whether this engine scores given completions (`encode_prompts`, `encode_completions`,
    `completion_logprobs`); an owner serves difference releases only with an engine that does."""

    def encode_prompts(
        self, prompts: Sequence[str], max_new_tokens: int, shape: FixedShape | None = None
    ) -> list[tuple[int, ...]]:
        """The prompt ids `generate` would feed for these prompts (cut to the room left by
        max_new_tokens, or to shape.prompt_tokens); () for a prompt that cannot be encoded."""
        raise NotImplementedError(f"engine {self.name!r} does not score given completions")

    def encode_completions(self, texts: Sequence[str], completion_tokens: int) -> list[tuple[int, ...]]:
        """Each text as completion ids followed by EOS, cut to completion_tokens; () for a text that
        cannot be encoded. Never raises for one text."""
        raise NotImplementedError(f"engine {self.name!r} does not score given completions")

    def completion_logprobs(
        self,
        prompt_ids: Sequence[tuple[int, ...]],
        completions: Sequence[Sequence[tuple[int, ...]]],
        temperature: float,
        completion_tokens: int,
        shape: FixedShape | None = None,
    ) -> Any:
        """Teacher forcing: for prompt r and its s-th completion, the sum over the completion's
        tokens of log softmax(logits / temperature) at that token. Returns a float64 array of
        shape (len(prompt_ids), samples), every prompt having the same number of completions.
        A prompt or completion that is () scores 0. With `shape`, every forward pass has one
        public shape (shape.batch_prompts prompts with all their completions, each sequence
        shape.prompt_tokens + completion_tokens wide), so a row's value and the time taken
        depend on nothing but that row and public sizes, as in `generate`."""
        raise NotImplementedError(f"engine {self.name!r} does not score given completions")
