"""Batched generation with a plain transformers model and our own decoding loop.

Why not model.generate: it samples from the global torch RNG, so results would depend on
whatever else ran before. Here every random number comes from `sampling.py`, drawn per row
from (params.seed, row key), so results depend only on (weights, prompt, row key,
num_samples, params), and evaluating two checkpoints with one seed is a paired comparison.

How prompts are encoded: one at a time, without special tokens, left-truncated (the end,
where the question and "Answer:" are, is kept) to `max_position_embeddings - max_new_tokens`
tokens, or to `shape.prompt_tokens` with a FixedShape; the text is first cut to its last
MAX_CHARS_PER_TOKEN characters per kept token (engines/base.py), a public bound on the work. A prompt that tokenizes to nothing,
makes the tokenizer fail, or yields an id outside the embedding is not an error: it gets
placeholder generations (Generation.encoded is False) and, with a FixedShape, still occupies
a slot (a dummy row), so the work done does not depend on it.

How a batch is run: prompts are left-padded, prefilled once, then the KV cache is repeated
`num_samples` times (rows are prompt-major: row = prompt * S + sample); decoding feeds one
token per step with explicit position ids (left padding shifts them). Two batching modes:
- dynamic (no shape; trainer rollouts, which need speed): prompts sorted by length, chunks of
  about `batch_size` sequences padded to the chunk's longest prompt, early stop once every
  row has produced EOS;
- fixed (`shape`; the owner, which needs invariance): prompts in the given order, exactly
  `shape.batch_prompts` per batch (the last one filled with dummy rows), every prompt padded
  to exactly `shape.prompt_tokens`, and all max_new_tokens steps decoded (finished rows keep
  emitting pad). Time and memory then depend only on (number of prompts, shape, params), and
  a row's floats do not depend on its batch-mates: tests/rlvr_core/test_engines_fixed_shape.py
  checks that adding or removing one prompt leaves every other row's ids identical.

Throughput: `rlvr_core.engines.throughput.measure_throughput` times any engine;
`tools/bench_engine.py --shape-cost` compares the two modes.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import numpy as np
import torch
from pydantic import Field
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from rlvr_core.configuration import OptionsSection
from rlvr_core.engines.base import (
    FixedShape,
    Generation,
    GenerationEngine,
    SamplingParams,
    completion_budget,
    context_length,
    prompt_budget,
)
from rlvr_core.engines.registry import ENGINES
from rlvr_core.engines.sampling import resolve_row_keys, row_uniforms, select_tokens, validate_params
from rlvr_core.models.threads import torch_threads

Batch = list[int | None]  # prompt indices of one forward pass; None is a dummy slot


def max_positions(model: PreTrainedModel) -> int:
    """Context length of the model (prompt + completion)."""
    return context_length(model.config)


class TransformersEngineOptions(OptionsSection):
    """Options of the "transformers" engine (a trainer's `[rollout.options]`)."""

    batch_size: int = Field(
        default=64, ge=1, description="Sequences per chunk (dynamic batching: trainer rollouts; the owner's "
        "fixed shapes set their own batch)."
    )
    num_threads: int | None = Field(
        default=None, ge=1, description="CPU torch threads while generating, restored afterwards; None "
        "keeps the process setting. 1 is much faster for tiny models on a busy small box."
    )


@ENGINES.register("transformers", options=TransformersEngineOptions)
class TransformersEngine(GenerationEngine):
    """Generation on CPU or CUDA with the live model (so sync_weights is a no-op)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        device: str | torch.device = "cpu",
        batch_size: int = 64,
        num_threads: int | None = None,
    ) -> None:
        """`num_threads` (CPU): torch threads while generating, restored afterwards; None keeps
        the process setting. 1 is much faster for tiny models on a busy small box.
        `batch_size` (sequences per chunk) applies to dynamic batching only."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has no eos_token_id")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.num_threads = num_threads
        # Ids the engine feeds itself (pads, dummy rows, sampled tokens) must index the
        # embedding, whatever the tokenizer claims: an out-of-range id would raise mid-batch.
        self.embedding_rows = int(model.get_input_embeddings().num_embeddings)
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id)
        for field_name, value in (("eos_token_id", self.eos_id), ("pad_token_id", self.pad_id)):
            if not 0 <= value < self.embedding_rows:
                raise ValueError(
                    f"tokenizer {field_name} {value} is outside the model's {self.embedding_rows} embedding rows"
                )
        # transformers 5 renamed the forward argument `past_key_values` to `cache`.
        forward_params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        self._can_keep_last_logits = "logits_to_keep" in forward_params
        # Given the config, the cache knows per-layer kinds (e.g. sliding-window layers).
        self._cache_takes_config = "config" in inspect.signature(DynamicCache.__init__).parameters

    def sync_weights(self) -> None:
        """No-op: the engine generates with the trainer's live model object."""

    def generate(
        self,
        prompts: list[str],
        num_samples: int,
        params: SamplingParams,
        row_keys: Sequence[int] | None = None,
        shape: FixedShape | None = None,
    ) -> list[list[Generation]]:
        validate_params(params, num_samples)
        keys = resolve_row_keys(row_keys, len(prompts))
        room = self._prompt_room(params.max_new_tokens, shape)
        if not prompts:
            return []
        prompt_ids = [self._encode(prompt, room) for prompt in prompts]
        uniforms = [row_uniforms(params.seed, key, num_samples, params.max_new_tokens) for key in keys]
        if shape is None:
            batches = self._dynamic_batches(prompt_ids, num_samples)
        else:
            batches = _fixed_batches(len(prompts), shape.batch_prompts)
        placeholder = Generation("", (), (), False)
        results: list[list[Generation]] = [[placeholder] * num_samples if not ids else [] for ids in prompt_ids]
        dummy_ids = (self.eos_id,)
        dummy_uniforms = torch.zeros((num_samples, params.max_new_tokens), dtype=torch.float64)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), torch_threads(self.num_threads):
                for batch in batches:
                    # Dummy slots and unencodable prompts run as a one-token row; outputs dropped.
                    ids = [prompt_ids[i] if i is not None and prompt_ids[i] else dummy_ids for i in batch]
                    width = shape.prompt_tokens if shape is not None else max(len(row) for row in ids)
                    batch_uniforms = torch.stack(
                        [uniforms[i] if i is not None else dummy_uniforms for i in batch]
                    )
                    completions = self._generate_batch(
                        ids, width, num_samples, params, batch_uniforms, stop_early=shape is None
                    )
                    texts = self._decode([completion for completion, _ in completions])
                    for row, ((completion, finished), text) in enumerate(zip(completions, texts)):
                        index = batch[row // num_samples]
                        if index is None or not prompt_ids[index]:
                            continue
                        results[index].append(Generation(text, prompt_ids[index], tuple(completion), finished))
        finally:
            self.model.train(was_training)
        return results

    # --- teacher forcing ------------------------------------------------------------------------

    teacher_forcing = True

    def encode_prompts(
        self, prompts: Sequence[str], max_new_tokens: int, shape: FixedShape | None = None
    ) -> list[tuple[int, ...]]:
        room = self._prompt_room(max_new_tokens, shape)
        return [self._encode(prompt, room) for prompt in prompts]

    def encode_completions(self, texts: Sequence[str], completion_tokens: int) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = []
        for text in texts:
            try:
                ids = [int(token) for token in self.tokenizer(completion_budget(text, completion_tokens),
                                                              add_special_tokens=False, verbose=False)["input_ids"]]
            except Exception:  # noqa: BLE001 - an untrusted tokenizer's failure is confined to its row
                out.append(())
                continue
            ids.append(self.eos_id)
            ok = all(0 <= token < self.embedding_rows for token in ids)
            out.append(tuple(ids[:completion_tokens]) if ok else ())
        return out

    def completion_logprobs(
        self,
        prompt_ids: Sequence[tuple[int, ...]],
        completions: Sequence[Sequence[tuple[int, ...]]],
        temperature: float,
        completion_tokens: int,
        shape: FixedShape | None = None,
    ) -> np.ndarray:
        if len(completions) != len(prompt_ids):
            raise ValueError(f"completions has {len(completions)} rows for {len(prompt_ids)} prompts; pass one per prompt")
        samples = len(completions[0]) if completions else 0
        if any(len(row) != samples for row in completions):
            raise ValueError("completions: every prompt needs the same number of completions")
        if not (temperature > 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be finite and > 0, got {temperature}")
        if completion_tokens < 1:
            raise ValueError(f"completion_tokens must be >= 1, got {completion_tokens}")
        out = np.zeros((len(prompt_ids), samples), dtype=np.float64)
        if not prompt_ids or samples == 0:
            return out
        room = self._prompt_room(completion_tokens, shape)
        if shape is None:
            per_chunk = max(1, self.batch_size // samples)
            order = [i for i, ids in enumerate(prompt_ids) if ids]
            batches: list[Batch] = [list(order[s : s + per_chunk]) for s in range(0, len(order), per_chunk)]
        else:
            batches = _fixed_batches(len(prompt_ids), shape.batch_prompts)
        dummy = ((self.eos_id,), (self.eos_id,))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), torch_threads(self.num_threads):
                for batch in batches:
                    pairs = []
                    for index in batch:
                        usable = index is not None and bool(prompt_ids[index])
                        for sample in range(samples):
                            if usable:
                                pairs.append((tuple(prompt_ids[index][-room:]),
                                              tuple(completions[index][sample][:completion_tokens])))
                            else:
                                pairs.append(dummy)
                    width = shape.prompt_tokens if shape is not None else max(len(p) for p, _ in pairs)
                    scores = self._score_pairs(pairs, width, completion_tokens, temperature)
                    for position, index in enumerate(batch):
                        if index is not None and prompt_ids[index]:
                            out[index] = scores[position * samples : (position + 1) * samples]
        finally:
            self.model.train(was_training)
        return out

    def _score_pairs(
        self, pairs: list[tuple[tuple[int, ...], tuple[int, ...]]], width: int, completion_tokens: int,
        temperature: float,
    ) -> np.ndarray:
        """One forward pass over (prompt, completion) pairs: prompts left-padded to `width`,
        completions right-padded to `completion_tokens`; the summed completion log-probs (R,).
        An empty completion sums to 0. Only the completion positions' logits are kept."""
        length = width + completion_tokens
        input_ids = torch.full((len(pairs), length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(pairs), length), dtype=torch.long)
        completion_mask = torch.zeros((len(pairs), completion_tokens), dtype=torch.float32)
        for row, (prompt, completion) in enumerate(pairs):
            input_ids[row, width - len(prompt) : width] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) : width] = 1
            if completion:
                input_ids[row, width : width + len(completion)] = torch.tensor(completion, dtype=torch.long)
                attention_mask[row, width : width + len(completion)] = 1
                completion_mask[row, : len(completion)] = 1.0
        position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
        device = self.device
        kwargs = {"logits_to_keep": completion_tokens + 1} if self._can_keep_last_logits else {}
        logits = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                            position_ids=position_ids.to(device), use_cache=False, **kwargs).logits
        # position width - 1 + t predicts completion token t
        logits = logits[:, -(completion_tokens + 1) : -1, : self.embedding_rows].float() / temperature
        targets = input_ids[:, width:].to(device).clamp(max=self.embedding_rows - 1)
        picked = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
        return (picked * completion_mask.to(device)).sum(dim=-1).double().cpu().numpy()

    def _prompt_room(self, max_new_tokens: int, shape: FixedShape | None) -> int:
        """How many prompt tokens are kept; raises ValueError naming the field that does not fit."""
        positions = max_positions(self.model)
        if shape is not None:
            shape.check_fits(max_new_tokens, positions)
            return shape.prompt_tokens
        room = positions - max_new_tokens
        if room < 1:
            raise ValueError(
                f"params.max_new_tokens ({max_new_tokens}) leaves no room for a prompt in "
                f"the model's {positions} positions"
            )
        return room

    def _encode(self, prompt: str, room: int) -> tuple[int, ...]:
        """The kept ids of one prompt, or () when it cannot be encoded (never raises)."""
        try:
            ids = self.tokenizer(prompt_budget(prompt, room), add_special_tokens=False, verbose=False)["input_ids"]
            ids = [int(token) for token in ids]
        except Exception:  # noqa: BLE001 - an untrusted tokenizer's failure is confined to its row
            return ()
        if not all(0 <= token < self.embedding_rows for token in ids):
            return ()
        return tuple(ids[-room:]) if ids else ()

    def _decode(self, completions: list[list[int]]) -> list[str]:
        """Texts of the completions; a row the tokenizer cannot decode gets "" (never raises)."""
        try:
            return list(self.tokenizer.batch_decode(completions, skip_special_tokens=True))
        except Exception:  # noqa: BLE001 - find the failing rows; the others keep their text
            texts = []
            for ids in completions:
                try:
                    texts.append(str(self.tokenizer.decode(ids, skip_special_tokens=True)))
                except Exception:  # noqa: BLE001
                    texts.append("")
            return texts

    def _dynamic_batches(self, prompt_ids: list[tuple[int, ...]], num_samples: int) -> list[Batch]:
        """Encodable prompts sorted by length (less padding), about batch_size sequences a chunk."""
        order = sorted((i for i, ids in enumerate(prompt_ids) if ids), key=lambda i: (-len(prompt_ids[i]), i))
        per_chunk = max(1, self.batch_size // num_samples)
        return [list(order[start : start + per_chunk]) for start in range(0, len(order), per_chunk)]

    def _forward(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        """One model call; returns last-position logits (R, V) over ids the embedding accepts."""
        kwargs = {self._cache_kwarg: cache, "use_cache": True}
        if self._can_keep_last_logits:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        return out.logits[:, -1, : self.embedding_rows]

    def _generate_batch(
        self,
        batch_ids: list[tuple[int, ...]],
        width: int,
        num_samples: int,
        params: SamplingParams,
        uniforms: torch.Tensor,
        stop_early: bool,
    ) -> list[tuple[list[int], bool]]:
        """Generate for one batch of prompts (each at most `width` ids); uniforms (P, S, T).

        Returns one (ids cut after EOS, finished) per row, prompt-major: row = prompt * S + sample.
        """
        device = self.device
        input_ids = torch.full((len(batch_ids), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch_ids), width), dtype=torch.long)
        for row, ids in enumerate(batch_ids):  # left padding
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # (P, W)

        cache = DynamicCache(config=self.model.config) if self._cache_takes_config else DynamicCache()
        logits = self._forward(input_ids, attention_mask, position_ids, cache)  # (P, V)
        if num_samples > 1:  # encode each prompt once, then fan out to its samples
            cache.batch_repeat_interleave(num_samples)
            logits = logits.repeat_interleave(num_samples, dim=0)
            attention_mask = attention_mask.repeat_interleave(num_samples, dim=0)
            position_ids = position_ids.repeat_interleave(num_samples, dim=0)
        rows = logits.shape[0]
        row_uniforms = uniforms.reshape(rows, -1).to(device)  # (R, T)
        next_position = position_ids[:, -1:] + 1  # (R, 1)
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        steps: list[torch.Tensor] = []
        for step in range(params.max_new_tokens):
            tokens = select_tokens(logits, params.temperature, params.top_p, row_uniforms[:, step])
            tokens = torch.where(finished, torch.full_like(tokens, self.pad_id), tokens)
            steps.append(tokens)
            finished |= tokens == self.eos_id
            if step == params.max_new_tokens - 1 or (stop_early and bool(finished.all())):
                break
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(rows, 1)], dim=-1)
            logits = self._forward(tokens[:, None], attention_mask, next_position, cache)
            next_position = next_position + 1
        generated = torch.stack(steps, dim=1).tolist()  # (R, steps)
        return [_cut_at_eos(ids, self.eos_id) for ids in generated]


def _fixed_batches(num_prompts: int, batch_prompts: int) -> list[Batch]:
    """Prompts in order, exactly batch_prompts per batch; the last batch filled with dummies."""
    batches: list[Batch] = []
    for start in range(0, num_prompts, batch_prompts):
        batch: Batch = list(range(start, min(start + batch_prompts, num_prompts)))
        batches.append(batch + [None] * (batch_prompts - len(batch)))
    return batches


def _cut_at_eos(ids: list[int], eos_id: int) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first EOS; report whether there was one."""
    if eos_id in ids:
        return ids[: ids.index(eos_id) + 1], True
    return ids, False
