"""The trainer's resolved knobs, cut from TrainConfig so the trainer never reads TOML shapes."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer_node.config import TrainConfig
from trainer_node.grpo.losses import LossSettings


@dataclass(frozen=True)
class GRPOSettings:
    seed: int = 0
    advantage: str = "grpo"
    loss: str = "ppo_clip"
    loss_settings: LossSettings = field(default_factory=LossSettings)
    lr: float = 3e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_accum_steps: int = 1
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1
    mini_batches: int = 1
    overlong_buffer: int = 0
    overlong_penalty_factor: float = 1.0
    adv_eps: float = 1e-6
    lookahead: str = "adamw"
    lookahead_lr: float | None = None
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0

    @classmethod
    def from_config(cls, config: TrainConfig) -> GRPOSettings:
        g, r = config.grpo, config.rollout
        return cls(
            seed=config.run.seed,
            advantage=g.advantage,
            loss=g.loss,
            loss_settings=LossSettings(
                eps_low=g.eps_low, eps_high=g.eps_high, kl_coef=g.kl_coef, aggregation=g.loss_aggregation
            ),
            lr=g.lr,
            weight_decay=g.weight_decay,
            betas=tuple(g.betas),
            adam_eps=g.adam_eps,
            grad_accum_steps=g.grad_accum_steps,
            max_grad_norm=g.max_grad_norm,
            ppo_epochs=g.ppo_epochs,
            mini_batches=g.mini_batches,
            overlong_buffer=g.overlong_buffer,
            overlong_penalty_factor=g.overlong_penalty_factor,
            adv_eps=g.adv_eps,
            lookahead=g.lookahead,
            lookahead_lr=g.lookahead_lr,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
        )
