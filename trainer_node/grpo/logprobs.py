"""Per-token log-probabilities of a PolicyBatch under a causal LM."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer_node.grpo.batch import PolicyBatch


def token_logprobs(
    model: torch.nn.Module, batch: PolicyBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs (B, T), entropy (B, T) or None); column 0 is 0 (nothing predicts it).

    Logits are divided by the sampling temperature, as in verl/TRL, so that the ratio and
    the KL refer to the distribution the rollouts were actually drawn from.
    """
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # (B, T, V)
    logits = logits[:, :-1].float() / temperature
    log_probs = F.log_softmax(logits, dim=-1)  # (B, T-1, V)
    picked = log_probs.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    out = F.pad(picked, (1, 0))
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = F.pad(-(log_probs.exp() * log_probs).sum(-1), (1, 0))
    return out, entropy
