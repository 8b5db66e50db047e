"""Short supervised warm-up: teach a random-init policy the answer format before GRPO.

Each example is `prompt_ids + completion_ids + [eos]`, with the loss on completion tokens
(and the EOS) only. Prompt and completion are tokenized separately, exactly as the engine
sees them at generation time (it tokenizes the rendered prompt and generates from there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerFast

IGNORE_INDEX = -100  # label value the transformers loss skips


@dataclass(frozen=True)
class SftSettings:
    steps: int
    batch_size: int
    lr: float
    seed: int
    max_length: int
    warmup_fraction: float = 0.05
    min_lr_fraction: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0


def encode_pairs(
    tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[str, str]], max_length: int
) -> list[tuple[list[int], int]]:
    """Return (token ids, prompt length) per pair; over-long prompts lose tokens on the left."""
    eos = tokenizer.eos_token_id
    encoded = []
    for prompt, completion in pairs:
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [eos]
        completion_ids = completion_ids[: max_length - 1]  # keep at least one prompt token
        prompt_ids = prompt_ids[max(0, len(prompt_ids) - (max_length - len(completion_ids))) :]
        if not prompt_ids:
            raise ValueError("SFT pair has an empty prompt after tokenization")
        encoded.append((prompt_ids + completion_ids, len(prompt_ids)))
    return encoded


def _collate(batch: list[tuple[list[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch for training: input_ids, attention_mask, labels all (B, T)."""
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    for row, (ids, prompt_len) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        labels[row, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _lr_factor(step: int, settings: SftSettings) -> float:
    """Linear warm-up, then cosine decay to `min_lr_fraction` of the peak."""
    warmup = max(1, int(settings.steps * settings.warmup_fraction))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, settings.steps - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return settings.min_lr_fraction + (1.0 - settings.min_lr_fraction) * cosine


def _batch_order(num_examples: int, settings: SftSettings) -> list[int]:
    """Indices for all steps: shuffled epochs from a dedicated generator (global RNG untouched)."""
    generator = torch.Generator().manual_seed(settings.seed)
    needed = settings.steps * settings.batch_size
    order: list[int] = []
    while len(order) < needed:
        order.extend(torch.randperm(num_examples, generator=generator).tolist())
    return order[:needed]


def supervised_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    pairs: list[tuple[str, str]],
    settings: SftSettings,
    progress: bool = True,
) -> list[float]:
    """Train `model` in place on `pairs`; return the loss of every step.

    AdamW with warm-up + cosine schedule and gradient clipping. Deterministic for a given
    seed and thread count (CPU kernels are deterministic at a fixed thread count).
    """
    if settings.steps <= 0:
        return []
    if not pairs:
        raise ValueError("sft_pairs must not be empty when sft_steps > 0")
    examples = encode_pairs(tokenizer, pairs, settings.max_length)
    order = _batch_order(len(examples), settings)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, settings))
    was_training = model.training
    model.train()
    losses: list[float] = []
    # disable=None: tqdm stays quiet off a terminal (logs, CI, background jobs).
    bar = tqdm(range(settings.steps), desc="SFT warm-up", disable=None if progress else True, leave=False)
    for step in bar:
        indices = order[step * settings.batch_size : (step + 1) * settings.batch_size]
        batch = _collate([examples[i] for i in indices], tokenizer.pad_token_id)
        batch = {name: tensor.to(device) for name, tensor in batch.items()}
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == settings.steps - 1:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.train(was_training)
    return losses
