"""Policy losses and token-aggregation rules, both registered by name.

Every loss has one signature: `(logprobs (B, T), PolicyBatch, LossSettings) -> LossOutput`.
`logprobs` are the current policy's per-token log-probabilities (with grad); everything else
(advantages, old/ref logprobs, masks, sample weights) comes in the typed batch, so a new loss
never needs a special case in the trainer.

Aggregations turn per-token losses (B, T) into a scalar. They divide by the normalisers of
the FULL batch (PolicyBatch.token_normaliser / sequence_normaliser), so micro-batch losses
add up exactly to the full-batch loss. Sample weights scale each row's contribution but do
not change the normaliser: weights of 1 give the plain loss, and weight 0 drops a row
(L2RR's lookahead candidates rely on this linearity). The update seams' token weights
(PolicyBatch.token_weights: selection mask times reweighting, grpo/update_seam.py) scale each
token's loss the same way; `seq_mean` still divides a response by its own length L, as
DataFlex-RL's Eq. 1-2 do.

To add one:
    @LOSSES.register("mine")          # or @AGGREGATIONS.register("mine")
    def mine(logprobs, batch, settings) -> LossOutput: ...   # (loss_tok, batch) -> scalar
and select it with `grpo.loss` / `grpo.loss_aggregation` (plug-ins: entry points
`target_feedback.losses` / `target_feedback.loss_aggregations`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from protocol.plugins import Registry, callable_entries
from trainer_node.grpo.batch import PolicyBatch


@dataclass(frozen=True)
class LossSettings:
    eps_low: float = 0.2      # ratio floor 1 - eps_low
    eps_high: float = 0.28    # ratio ceiling 1 + eps_high (DAPO clip-higher)
    kl_coef: float = 0.0      # weight of the k3 KL to the reference policy
    aggregation: str = "token_mean"


@dataclass
class LossOutput:
    loss: torch.Tensor                  # scalar, with grad
    metrics: dict[str, float] = field(default_factory=dict)  # token-means over the full batch


LossFn = Callable[[torch.Tensor, PolicyBatch, LossSettings], LossOutput]
AggregationFn = Callable[[torch.Tensor, PolicyBatch], torch.Tensor]


# The entries are defined below, so neither registry needs lazy built-ins.
LOSSES: Registry[LossFn] = Registry("losses", noun="policy loss", on_add=callable_entries("policy loss"))
AGGREGATIONS: Registry[AggregationFn] = Registry(
    "loss_aggregations", noun="loss aggregation", on_add=callable_entries("loss aggregation")
)


def loss_names() -> list[str]:
    return LOSSES.names()


def aggregation_names() -> list[str]:
    return AGGREGATIONS.names()


def get_loss(name: str) -> LossFn:
    return LOSSES.get(name)


def get_aggregation(name: str) -> AggregationFn:
    return AGGREGATIONS.get(name)


def _weighted_mask(batch: PolicyBatch, like: torch.Tensor) -> torch.Tensor:
    """(B, T) completion mask times the update seams' token weights (when any)."""
    mask = batch.completion_mask.to(like.dtype)
    if batch.token_weights is None:
        return mask
    return mask * batch.token_weights.to(like.dtype)


def _row_weights(batch: PolicyBatch, like: torch.Tensor) -> torch.Tensor:
    if batch.sample_weights is None:
        return torch.ones(batch.size, dtype=like.dtype, device=like.device)
    return batch.sample_weights.to(like.dtype)


@AGGREGATIONS.register("token_mean")
def token_mean(loss_tok: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
    """DAPO token-level: sum over every completion token / number of completion tokens."""
    per_row = (loss_tok * _weighted_mask(batch, loss_tok)).sum(dim=1)  # (B,)
    return (per_row * _row_weights(batch, loss_tok)).sum() / batch.token_normaliser()


@AGGREGATIONS.register("seq_mean")
def seq_mean(loss_tok: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
    """Original GRPO: mean over each sequence's tokens, then mean over sequences."""
    mask = batch.completion_mask.to(loss_tok.dtype)
    per_row = (loss_tok * _weighted_mask(batch, loss_tok)).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B,)
    return (per_row * _row_weights(batch, loss_tok)).sum() / batch.sequence_normaliser()


def masked_token_mean(values: torch.Tensor, batch: PolicyBatch) -> float:
    """A metric's token-mean with the full-batch normaliser (adds up over micro-batches)."""
    mask = batch.completion_mask.to(values.dtype)
    return float((values.detach() * mask).sum() / batch.token_normaliser())


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 >= 0."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


@LOSSES.register("ppo_clip")
def ppo_clip_loss(logprobs: torch.Tensor, batch: PolicyBatch, settings: LossSettings) -> LossOutput:
    """PPO clipped surrogate with asymmetric (clip-higher) bounds, plus optional k3 KL.

    loss_tok = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A), ratio = exp(logp - old).
    With no old logprobs (one on-policy pass) old = logp.detach(): ratio == 1, gradient = A * dlogp.
    """
    old = logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs
    ratio = torch.exp(logprobs - old)  # (B, T)
    adv = batch.advantages.to(logprobs.dtype).unsqueeze(1)  # (B, 1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - settings.eps_low, 1.0 + settings.eps_high) * adv
    loss_tok = -torch.minimum(unclipped, clipped)
    # A token is clipped when the clamped branch wins strictly (its gradient is then zero).
    is_clipped = (clipped < unclipped).to(logprobs.dtype)
    metrics = {
        "clip_frac": masked_token_mean(is_clipped, batch),
        "ratio_mean": masked_token_mean(ratio, batch),
    }
    if settings.kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs in the batch (a frozen reference model)")
        kl = k3_kl(logprobs, batch.ref_logprobs)
        loss_tok = loss_tok + settings.kl_coef * kl
        metrics["kl"] = masked_token_mean(kl, batch)
    loss = get_aggregation(settings.aggregation)(loss_tok, batch)
    return LossOutput(loss=loss, metrics=metrics)
