"""Hand-made inputs for the SetGRPO tests (seed 002): groups with two grader draws per rollout
and per-response gradient features. Not a test module."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from trainer_node.grpo.update_seam import UpdateInput


def make_input(scores: Sequence[Sequence[Sequence[float]]], features: np.ndarray | None = None,
               dim: int = 6, seed: int = 0) -> UpdateInput:
    """One group per entry of `scores`: K rows of (s1, s2). Features default to seeded Gaussians."""
    draws = [row for group in scores for row in group]
    group_ids = [g for g, group in enumerate(scores) for _ in group]
    n = len(draws)
    mask = torch.zeros(n, 3)
    mask[:, 1:] = 1.0
    if features is None:
        features = np.random.default_rng(seed).standard_normal((n, dim))
    s = torch.tensor(draws, dtype=torch.float64)
    return UpdateInput(
        rewards=s[:, 0].clone(), advantages=torch.zeros(n), group_ids=torch.tensor(group_ids),
        lengths=mask.sum(dim=1), completion_mask=mask, keep=torch.ones(n, dtype=torch.bool),
        grader_scores=s, group_geometry={"features": torch.tensor(features, dtype=torch.float64)},
    )


def noisy_groups(rng: np.random.Generator, groups: int, k: int = 6, flip: float = 0.15) -> list[list[list[float]]]:
    """Binary rewards with a per-group solve rate and two independently flipped draws."""
    out = []
    for _ in range(groups):
        p = rng.uniform(0.2, 0.8)
        truth = (rng.random(k) < p).astype(float)
        draws = [np.where(rng.random(k) < flip, 1 - truth, truth) for _ in range(3)]
        out.append([[float(d[i]) for d in draws] for i in range(k)])
    return out
