"""Shared fixtures for the GRPO core tests: a toy source pool, a smooth toy reward, and a
trainer on a random tiny Qwen2 (hidden 32, 2 layers) with the real transformers engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr_core.engines.base import SamplingParams
from rlvr_core.engines.registry import build_engine
from rlvr_core.models.loading import load_policy
from rlvr_core.models.tiny_policy import random_tiny_policy
from rlvr_core.tasks.example import Example
from trainer_node.grpo.settings import GRPOSettings
from trainer_node.grpo.trainer import GRPOTrainer
from trainer_node.policies.base import SourcePool, build_policy

TOY_EXAMPLES = tuple(
    Example(id=f"toy-{i}", prompt=f"add {i} and {i + 1}", answer=str(2 * i + 1), domain="even" if i % 2 else "odd")
    for i in range(12)
)
VOCAB_TEXTS = [e.prompt for e in TOY_EXAMPLES] + [e.answer for e in TOY_EXAMPLES] + ["0123456789 Answer:"]


def toy_pool() -> SourcePool:
    return SourcePool(examples=TOY_EXAMPLES, clusters=tuple(e.domain for e in TOY_EXAMPLES))


def toy_reward(text: str, example: Example) -> float:
    """Share of completion characters that are digits: smooth, so groups rarely tie."""
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def render(example: Example) -> str:
    return f"{example.prompt}\nAnswer:"


def make_model_dir(root: Path) -> Path:
    return random_tiny_policy(root / "random_tiny", VOCAB_TEXTS, seed=0)


SAMPLING = SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1.0, seed=7)  # rollouts; seed = run seed


def make_settings(**overrides: Any) -> GRPOSettings:
    return GRPOSettings(**{"lr": 1e-2, **overrides})


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
