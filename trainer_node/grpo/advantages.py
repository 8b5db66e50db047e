"""Group-relative advantage estimators, registered by name.

Every estimator has one signature: `(AdvantageInput) -> Tensor (N,)`. Groups may have
different sizes (adaptive rollout allocation gives each prompt its own n), so rewards come
flat with a group index per rollout instead of as a (G, n) matrix.

To add one:
    @ADVANTAGES.register("mine")
    def mine(inputs: AdvantageInput) -> torch.Tensor: ...   # (N,)
and select it with `grpo.advantage = "mine"` (a plug-in: entry point `target_feedback.advantages`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from protocol.plugins import Registry, callable_entries


@dataclass(frozen=True)
class AdvantageInput:
    rewards: torch.Tensor    # (N,) float, one reward per rollout
    group_ids: torch.Tensor  # (N,) long in [0, G), the prompt group of each rollout
    eps: float = 1e-6        # std floor for "grpo"

    def __post_init__(self) -> None:
        if self.rewards.shape != self.group_ids.shape or self.rewards.dim() != 1:
            raise ValueError(
                f"AdvantageInput: rewards {tuple(self.rewards.shape)} and group_ids "
                f"{tuple(self.group_ids.shape)} must be 1-D and the same length"
            )


AdvantageFn = Callable[[AdvantageInput], torch.Tensor]


# The estimators are defined below, so the registry needs no lazy built-ins.
ADVANTAGES: Registry[AdvantageFn] = Registry(
    "advantages", noun="advantage estimator", on_add=callable_entries("advantage estimator")
)


def advantage_names() -> list[str]:
    return ADVANTAGES.names()


def get_advantage(name: str) -> AdvantageFn:
    return ADVANTAGES.get(name)


def compute_advantages(name: str, inputs: AdvantageInput) -> torch.Tensor:
    """Flat advantages (N,) from the estimator registered as `name`."""
    return get_advantage(name)(inputs)


@dataclass(frozen=True)
class GroupStats:
    mean: torch.Tensor           # (N,) mean reward of each rollout's group
    std: torch.Tensor            # (N,) unbiased std of the group (0 for groups of one)
    zero_variance: torch.Tensor  # (N,) bool: every reward in the group is equal


def group_stats(inputs: AdvantageInput) -> GroupStats:
    """Per-group mean and std broadcast back to rollouts, via scatter-add over group ids."""
    rewards = inputs.rewards.to(torch.float64)
    ids = inputs.group_ids.long()
    groups = int(ids.max()) + 1 if ids.numel() else 0
    count = torch.zeros(groups, dtype=torch.float64).index_add_(0, ids, torch.ones_like(rewards))
    total = torch.zeros(groups, dtype=torch.float64).index_add_(0, ids, rewards)
    mean = (total / count.clamp(min=1))[ids]
    squares = torch.zeros(groups, dtype=torch.float64).index_add_(0, ids, (rewards - mean) ** 2)
    # Unbiased (Bessel) std, as torch.std in verl/TRL; a group of one has no spread.
    std = (squares / (count - 1).clamp(min=1)).sqrt()[ids]
    # Equal rewards can leave a ~1e-17 std after rounding, so test max == min instead.
    zeros = torch.zeros(groups, dtype=torch.float64)
    spread = zeros.scatter_reduce(0, ids, rewards, "amax", include_self=False) - zeros.scatter_reduce(
        0, ids, rewards, "amin", include_self=False
    )
    zero_variance = (spread == 0)[ids] | (count[ids] < 2)
    return GroupStats(mean=mean, std=std, zero_variance=zero_variance)


@ADVANTAGES.register("grpo")
def grpo_advantage(inputs: AdvantageInput) -> torch.Tensor:
    """GRPO: (r - mean_g) / (std_g + eps). Zero-variance groups get exactly 0."""
    stats = group_stats(inputs)
    adv = (inputs.rewards.to(torch.float64) - stats.mean) / (stats.std + inputs.eps)
    return torch.where(stats.zero_variance, torch.zeros_like(adv), adv).to(inputs.rewards.dtype)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantage(inputs: AdvantageInput) -> torch.Tensor:
    """Dr. GRPO: r - mean_g, no std normalisation (removes the difficulty bias of /std)."""
    stats = group_stats(inputs)
    adv = inputs.rewards.to(torch.float64) - stats.mean
    return torch.where(stats.zero_variance, torch.zeros_like(adv), adv).to(inputs.rewards.dtype)
