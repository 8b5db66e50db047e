"""The signals DataFlex-RL's selection and reweighting rules read (seed 001, "Key Signals"),
computed from the typed UpdateInput, one pure function each. A signal is not an intervention:
the same signal (mean absolute advantage) drives a selection rule (topk) and two reweighting
rules (per, softmax), which is the comparison DataFlex-RL is built to make.
"""

from __future__ import annotations

import torch

from trainer_node.grpo.update_seam import UpdateInput


def mean_abs_advantage(inputs: UpdateInput) -> torch.Tensor:
    """a_gk = (1/L_gk) sum_l |A_gkl|  (N,). Outcome advantages are shared by every token of a
    response, so this is |A_gk| for a non-empty response and 0 for an empty one (L clamped to 1,
    as DataFlex-RL's advantage_magnitude scorer)."""
    mask = inputs.completion_mask.to(torch.float64)
    per_token = inputs.advantages.to(torch.float64).abs().unsqueeze(1) * mask
    return per_token.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def group_solve_rate(inputs: UpdateInput, success_threshold: float = 0.5) -> torch.Tensor:
    """q_g = (1/K) sum_k 1[r_gk > threshold], broadcast to each rollout of group g  (N,)."""
    solved = (inputs.rewards > success_threshold).to(torch.float64)
    ids = inputs.group_ids
    groups = inputs.num_groups
    totals = torch.zeros(groups, dtype=torch.float64, device=solved.device).index_add_(0, ids, solved)
    counts = torch.zeros(groups, dtype=torch.float64, device=solved.device).index_add_(0, ids, torch.ones_like(solved))
    return (totals / counts.clamp(min=1.0))[ids]


def efficiency(inputs: UpdateInput) -> torch.Tensor:
    """r_gk / L_gk  (N,), L clamped to 1 (GFPO's token efficiency, as DataFlex-RL computes it)."""
    return inputs.rewards.to(torch.float64) / inputs.lengths.to(torch.float64).clamp(min=1.0)


def token_probabilities(inputs: UpdateInput) -> torch.Tensor:
    """pi_gkl = exp(log pi_old)  (N, T), 0 off the completion tokens. Needs "token_logprobs"."""
    if inputs.token_logprobs is None:
        raise ValueError("token_probabilities needs UpdateInput.token_logprobs; the rule must list "
                         "\"token_logprobs\" in `requires`")
    return inputs.token_logprobs.to(torch.float64).exp() * inputs.completion_mask.to(torch.float64)
