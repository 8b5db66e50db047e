"""The typed batch that every policy loss receives, and how it is built from rollout groups.

Layout: each row is one rollout, `prompt_ids + completion_ids`, right-padded to T. Right
padding keeps position ids equal to `arange(T)` for every real token, so no position-id
bookkeeping is needed. `logprobs[:, t]` is log p(input_ids[:, t] | input_ids[:, :t]); column 0
has no prediction and is never on the completion mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

import torch

from trainer_node.policies.base import Group


@dataclass(frozen=True)
class PolicyBatch:
    input_ids: torch.Tensor                 # (B, T) long, right-padded with pad_id
    attention_mask: torch.Tensor            # (B, T) 1 on prompt + completion tokens
    completion_mask: torch.Tensor           # (B, T) float, 1 on completion tokens only
    advantages: torch.Tensor                # (B,) float
    old_logprobs: torch.Tensor | None = None  # (B, T); None = on-policy single pass (ratio == 1)
    ref_logprobs: torch.Tensor | None = None  # (B, T); needed only when kl_coef > 0
    sample_weights: torch.Tensor | None = None  # (B,); None = all 1 (L2RR lookahead weights)
    group_ids: torch.Tensor | None = None   # (B,) long, row -> group position in the batch
    # (B, T) m_gk * w_gkl of the update seams (grpo/update_seam.py); None = all 1 (no rule selected).
    token_weights: torch.Tensor | None = None
    # Normalisers of the FULL batch this one was cut from, so that the losses of micro-batches
    # add up exactly to the full-batch loss (gradient accumulation is then exact).
    total_completion_tokens: float | None = None
    total_sequences: float | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def token_normaliser(self) -> float:
        if self.total_completion_tokens is not None:
            return self.total_completion_tokens
        return max(float(self.completion_mask.sum()), 1.0)

    def sequence_normaliser(self) -> float:
        if self.total_sequences is not None:
            return self.total_sequences
        return float(max(self.size, 1))

    def with_normalisers(self) -> PolicyBatch:
        """Freeze this batch's own normalisers so that `rows()` slices keep them."""
        return replace(
            self,
            total_completion_tokens=self.token_normaliser(),
            total_sequences=self.sequence_normaliser(),
        )

    def rows(self, index: torch.Tensor | slice) -> PolicyBatch:
        """A sub-batch of rows; normalisers stay those of the parent (call with_normalisers first)."""

        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index]

        return replace(
            self,
            input_ids=self.input_ids[index],
            attention_mask=self.attention_mask[index],
            completion_mask=self.completion_mask[index],
            advantages=self.advantages[index],
            old_logprobs=take(self.old_logprobs),
            ref_logprobs=take(self.ref_logprobs),
            sample_weights=take(self.sample_weights),
            group_ids=take(self.group_ids),
            token_weights=take(self.token_weights),
        )

    def split(self, parts: int) -> list[PolicyBatch]:
        """`parts` contiguous micro-batches (fewer if there are fewer rows), normalisers kept."""
        full = self.with_normalisers()
        bounds = torch.linspace(0, self.size, steps=min(parts, self.size) + 1).round().long().tolist()
        return [full.rows(slice(a, b)) for a, b in pairwise(bounds) if b > a]

    def to(self, device: torch.device | str) -> PolicyBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            completion_mask=self.completion_mask.to(device),
            advantages=self.advantages.to(device),
            old_logprobs=move(self.old_logprobs),
            ref_logprobs=move(self.ref_logprobs),
            sample_weights=move(self.sample_weights),
            group_ids=move(self.group_ids),
            token_weights=move(self.token_weights),
        )


@dataclass(frozen=True)
class FlatRollouts:
    """Rollouts of a list of groups, flattened in group order."""

    rewards: torch.Tensor     # (N,) float64
    group_ids: torch.Tensor   # (N,) long, position of the group in the list
    prompt_ids: list[tuple[int, ...]]
    completion_ids: list[tuple[int, ...]]


def flatten_groups(groups: Sequence[Group]) -> FlatRollouts:
    rewards: list[float] = []
    group_ids: list[int] = []
    prompts: list[tuple[int, ...]] = []
    completions: list[tuple[int, ...]] = []
    for position, group in enumerate(groups):
        for rollout in group.rollouts:
            rewards.append(rollout.reward)
            group_ids.append(position)
            prompts.append(tuple(rollout.prompt_ids))
            completions.append(tuple(rollout.completion_ids))
    return FlatRollouts(
        rewards=torch.tensor(rewards, dtype=torch.float64),
        group_ids=torch.tensor(group_ids, dtype=torch.long),
        prompt_ids=prompts,
        completion_ids=completions,
    )


def collate(
    flat: FlatRollouts,
    advantages: torch.Tensor,
    pad_id: int,
    group_weights: Sequence[float] | None = None,
) -> PolicyBatch:
    """Right-pad prompt+completion rows into a PolicyBatch (no logprobs yet)."""
    rows = [p + c for p, c in zip(flat.prompt_ids, flat.completion_ids)]
    width = max((len(r) for r in rows), default=1)
    count = len(rows)
    input_ids = torch.full((count, width), pad_id, dtype=torch.long)
    attention = torch.zeros((count, width), dtype=torch.long)
    completion = torch.zeros((count, width), dtype=torch.float32)
    for i, (prompt, comp) in enumerate(zip(flat.prompt_ids, flat.completion_ids)):
        length = len(prompt) + len(comp)
        input_ids[i, :length] = torch.tensor(prompt + comp, dtype=torch.long)
        attention[i, :length] = 1
        # A completion token at column 0 would have no prediction; prompts are never empty.
        completion[i, max(len(prompt), 1):length] = 1.0
    weights = None
    if group_weights is not None:
        weights = torch.tensor(list(group_weights), dtype=torch.float32)[flat.group_ids]
    return PolicyBatch(
        input_ids=input_ids,
        attention_mask=attention,
        completion_mask=completion,
        advantages=advantages.to(torch.float32),
        sample_weights=weights,
        group_ids=flat.group_ids,
    )
