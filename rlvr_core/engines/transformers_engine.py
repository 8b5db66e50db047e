"""Batched generation with a plain transformers model and our own decoding loop.

Why not model.generate: it samples from the global torch RNG, so results would depend on
whatever else ran before. Here every random number comes from `sampling.py` (seeded by
params.seed), so results depend only on (weights, prompts, num_samples, params), and
evaluating two checkpoints with one seed is a paired comparison.

How a batch is run:
- prompts are tokenized without special tokens; a prompt longer than
  `max_position_embeddings - max_new_tokens` tokens is truncated FROM THE LEFT (its end,
  where the question and "Answer:" are, is kept); Generation.prompt_ids are the kept ids;
- prompts are sorted by length and grouped so a chunk holds about `batch_size` sequences
  (always all samples of a prompt); each chunk is left-padded and prefilled once per prompt,
  then the KV cache is repeated `num_samples` times, so the prompt is encoded once;
- decoding feeds one token per step with explicit position ids (left padding shifts them)
  and stops per row at EOS, and for the chunk once every row has finished.

Throughput: `rlvr_core.engines.throughput.measure_throughput` times any engine;
`tools/bench_engine.py` reports it for the default tiny policy.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from rlvr_core.engines.base import Generation, GenerationEngine, SamplingParams
from rlvr_core.engines.sampling import sampling_uniforms, select_tokens, validate_params
from rlvr_core.models.threads import torch_threads


def max_positions(model: PreTrainedModel) -> int:
    """Context length of the model (prompt + completion)."""
    config = model.config
    value = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not value:
        raise ValueError("model config has no max_position_embeddings / n_positions")
    return int(value)


class TransformersEngine(GenerationEngine):
    """Generation on CPU or CUDA with the live model (so sync_weights is a no-op)."""

    name = "transformers"

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        device: str | torch.device = "cpu",
        batch_size: int = 64,
        num_threads: int | None = None,
    ) -> None:
        """`num_threads` (CPU): torch threads while generating, restored afterwards; None keeps
        the process setting. 1 is much faster for tiny models on a busy small box."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has no eos_token_id")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self.num_threads = num_threads
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id)
        # transformers 5 renamed the forward argument `past_key_values` to `cache`.
        forward_params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        self._can_keep_last_logits = "logits_to_keep" in forward_params
        # Given the config, the cache knows per-layer kinds (e.g. sliding-window layers).
        self._cache_takes_config = "config" in inspect.signature(DynamicCache.__init__).parameters

    def sync_weights(self) -> None:
        """No-op: the engine generates with the trainer's live model object."""

    def generate(self, prompts: list[str], num_samples: int, params: SamplingParams) -> list[list[Generation]]:
        validate_params(params, num_samples)
        if not prompts:
            return []
        prompt_ids = self._encode_prompts(prompts, params.max_new_tokens)
        uniforms = sampling_uniforms(params.seed, len(prompts), num_samples, params.max_new_tokens)
        order = sorted(range(len(prompts)), key=lambda index: (-len(prompt_ids[index]), index))
        per_chunk = max(1, self.batch_size // num_samples)
        results: list[list[Generation]] = [[] for _ in prompts]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), torch_threads(self.num_threads):
                for start in range(0, len(order), per_chunk):
                    chunk = order[start : start + per_chunk]
                    completions = self._generate_chunk(
                        [prompt_ids[index] for index in chunk], num_samples, params, uniforms[chunk]
                    )
                    texts = self.tokenizer.batch_decode(
                        [ids for ids, _ in completions], skip_special_tokens=True
                    )
                    for row, ((ids, finished), text) in enumerate(zip(completions, texts)):
                        index = chunk[row // num_samples]
                        results[index].append(
                            Generation(text, tuple(prompt_ids[index]), tuple(ids), finished)
                        )
        finally:
            self.model.train(was_training)
        return results

    def _encode_prompts(self, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
        room = max_positions(self.model) - max_new_tokens
        if room < 1:
            raise ValueError(
                f"params.max_new_tokens ({max_new_tokens}) leaves no room for a prompt in "
                f"the model's {max_positions(self.model)} positions"
            )
        encoded = self.tokenizer(list(prompts), add_special_tokens=False, verbose=False)["input_ids"]
        for index, ids in enumerate(encoded):
            if not ids:  # the index only: prompt text must never appear in errors
                raise ValueError(f"prompt at index {index} is empty")
        return [ids[-room:] for ids in encoded]

    def _forward(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        """One model call; returns last-position logits (R, V)."""
        kwargs = {self._cache_kwarg: cache, "use_cache": True}
        if self._can_keep_last_logits:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        return out.logits[:, -1, :]

    def _generate_chunk(
        self, chunk_ids: list[list[int]], num_samples: int, params: SamplingParams, uniforms: torch.Tensor
    ) -> list[tuple[list[int], bool]]:
        """Generate for a chunk of prompts; rows are prompt-major: row = prompt * S + sample."""
        device = self.device
        width = max(len(ids) for ids in chunk_ids)
        input_ids = torch.full((len(chunk_ids), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(chunk_ids), width), dtype=torch.long)
        for row, ids in enumerate(chunk_ids):  # left padding
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
            if bool(finished.all()) or step == params.max_new_tokens - 1:
                break
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(rows, 1)], dim=-1)
            logits = self._forward(tokens[:, None], attention_mask, next_position, cache)
            next_position = next_position + 1
        generated = torch.stack(steps, dim=1).tolist()  # (R, steps)
        return [_cut_at_eos(ids, self.eos_id) for ids in generated]


def _cut_at_eos(ids: list[int], eos_id: int) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first EOS; report whether there was one."""
    if eos_id in ids:
        return ids[: ids.index(eos_id) + 1], True
    return ids, False
