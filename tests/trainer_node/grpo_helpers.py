"""Shared fixtures for the GRPO core tests: a toy source pool, a smooth toy reward, and a
trainer on a random tiny Qwen2 (hidden 32, 2 layers) with the real transformers engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

# The toy workload itself lives in lab/ (benchmarks use it too); re-exported for the tests.
from lab.toy_grpo import (  # noqa: F401
    SAMPLING,
    TOY_EXAMPLES,
    VOCAB_TEXTS,
    make_settings,
    render,
    toy_pool,
    toy_reward,
)
from rlvr_core.engines.registry import build_engine
from rlvr_core.models.loading import load_policy
from rlvr_core.models.tiny_policy import random_tiny_policy
from trainer_node.grpo.settings import GRPOSettings
from trainer_node.grpo.trainer import GRPOTrainer
from trainer_node.policies.base import build_policy


def make_model_dir(root: Path) -> Path:
    return random_tiny_policy(root / "random_tiny", VOCAB_TEXTS, seed=0)


def make_trainer(
    model_dir: Path,
    settings: GRPOSettings | None = None,
    policy_name: str = "uniform",
    batch_size: int = 4,
    rollouts: int = 4,
    **trainer_kwargs: Any,
) -> GRPOTrainer:
    torch.manual_seed(0)
    model, tokenizer = load_policy(model_dir, "cpu", torch.float32)
    pool = toy_pool()
    options = {"name": policy_name, "batch_size": batch_size, "rollouts_per_prompt": rollouts}
    policy = build_policy(options, pool, np.random.default_rng(3))
    return GRPOTrainer(
        model=model,
        tokenizer=tokenizer,
        engine=build_engine("transformers", model, tokenizer),
        policy=policy,
        pool=pool,
        render=render,
        reward_fn=toy_reward,
        settings=settings or make_settings(),
        sampling=trainer_kwargs.pop("sampling", SAMPLING),
        **trainer_kwargs,
    )


def parameters(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
