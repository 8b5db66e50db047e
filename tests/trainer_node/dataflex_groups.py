"""Hand-made group batches for the DataFlex-RL calibration tests (seed 001): rewards, lengths,
advantages and token log-probabilities chosen so each rule's intervention can be worked out by
hand. Not a test module: the test_dataflex_* modules import it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer_node.grpo.advantages import AdvantageInput, grpo_advantage
from trainer_node.grpo.update_seam import UpdateInput


def make_input(
    groups: Sequence[Sequence[float]],
    lengths: Sequence[Sequence[int]] | None = None,
    width: int | None = None,
    token_logprobs: Sequence[Sequence[float]] | None = None,
    advantages: Sequence[float] | None = None,
) -> UpdateInput:
    """One group per list of rewards (K responses each); completion lengths default to 2 tokens;
    advantages default to GRPO's (r - mean) / (std + 1e-6). Completion tokens start at column 1
    (column 0 is the prompt's last token)."""
    rewards = [r for g in groups for r in g]
    group_ids = [i for i, g in enumerate(groups) for _ in g]
    flat_lengths = [n for g in lengths for n in g] if lengths is not None else [2] * len(rewards)
    width = width or (max(flat_lengths) + 1)
    mask = torch.zeros(len(rewards), width)
    for row, n in enumerate(flat_lengths):
        mask[row, 1:1 + n] = 1.0
    reward_tensor = torch.tensor(rewards, dtype=torch.float64)
    ids = torch.tensor(group_ids, dtype=torch.long)
    if advantages is None:
        adv = grpo_advantage(AdvantageInput(rewards=reward_tensor.float(), group_ids=ids))
    else:
        adv = torch.tensor(advantages, dtype=torch.float32)
    logprobs = None
    if token_logprobs is not None:
        logprobs = torch.tensor(token_logprobs, dtype=torch.float32)
    return UpdateInput(
        rewards=reward_tensor, advantages=adv, group_ids=ids, lengths=mask.sum(dim=1), completion_mask=mask,
        keep=torch.ones(len(rewards), dtype=torch.bool), token_logprobs=logprobs,
    )


def kept(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask, as_tuple=False).flatten().tolist()


def row_weights(factor: torch.Tensor, inputs: UpdateInput) -> list[float]:
    """The per-response weight of a (N, T) seam factor whose rows are constant on their tokens."""
    mask = inputs.completion_mask
    return ((factor * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).tolist()
