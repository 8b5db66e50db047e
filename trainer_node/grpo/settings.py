"""The GRPO core's knobs: one definition, which the run config's `[grpo]` section IS.

The core takes this object (and the rollout sampling parameters) and never reads the TOML
schema: trainer_node/config.py embeds GRPOSettings as its `grpo` section, tests and other
front-ends build it directly, e.g. `GRPOSettings(lr=1e-2, kl_coef=0.05)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, SerializeAsAny, ValidationInfo, field_validator

from rlvr_core.configuration import Section
from trainer_node.grpo.update_options import UpdateRuleOptions

if TYPE_CHECKING:
    from trainer_node.grpo.losses import LossSettings


class GRPOSettings(Section):
    """Advantage, loss and optimizer of the GRPO update (section `[grpo]`)."""

    advantage: str = Field(
        default="grpo", description="A registered advantage estimator: 'grpo' (r - mean) / std, 'dr_grpo' r "
        "- mean."
    )
    loss: str = Field(default="ppo_clip", description="A registered policy loss (trainer_node.grpo.losses).")
    loss_aggregation: str = Field(
        default="token_mean",
        description="'token_mean' (DAPO token-level) or 'seq_mean' (per-sequence mean, then mean).",
    )
    eps_low: float = Field(default=0.2, gt=0, lt=1, description="PPO ratio floor 1 - eps_low.")
    eps_high: float = Field(
        default=0.28, gt=0, description="PPO ratio ceiling 1 + eps_high (DAPO clip-higher)."
    )
    kl_coef: float = Field(
        default=0.0, ge=0, description="> 0 loads a frozen reference copy of the initial model and adds k3 "
        "KL."
    )
    lr: float = Field(
        default=3e-4, gt=0,
        description="AdamW learning rate. Tiny CPU policy: 2e-4 already collapses sub:easy within 100 steps "
        "on the default testbed.",
    )
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas, each in [0, 1).")
    adam_eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    grad_accum_steps: int = Field(
        default=1, gt=0, description="Micro-batches per optimizer step; the accumulated gradient equals the "
        "full-batch one."
    )
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    ppo_epochs: int = Field(
        default=1, gt=0, description="Passes over each batch. 1 = on-policy (ratio == 1)."
    )
    mini_batches: int = Field(
        default=1, gt=0, description="Optimizer steps per pass; > 1 makes later mini-batches off-policy "
        "(clipping matters)."
    )
    overlong_buffer: int = Field(
        default=0, ge=0, description="DAPO soft overlong penalty window in tokens (0 = off)."
    )
    overlong_penalty_factor: float = Field(
        default=1.0, ge=0, description="DAPO overlong penalty at the limit."
    )
    adv_eps: float = Field(default=1e-6, gt=0, description="Added to the group std before dividing.")
    lookahead: str = Field(
        default="adamw",
        description="How lookahead candidates (L2RR) take their one step: a registered lookahead optimizer "
        "(trainer_node.grpo.lookahead), 'adamw' (a copy of the AdamW state), 'sgd', or 'adam_preconditioned' "
        "(AdamW's per-coordinate scale, no momentum: a candidate moves along its own gradient only).",
    )
    lookahead_lr: float | None = Field(
        default=None, gt=0, description="Step size of lookahead candidates; None = lr."
    )
    lookahead_directions: Literal["batch", "cluster_mean"] = Field(
        default="batch",
        description="What a lookahead candidate (L2RR) steps along: 'batch', the gradient of this step's "
        "groups of its cluster; 'cluster_mean', each cluster's running direction over recent updates "
        "(trainer_node/grpo/cluster_directions.py: the gradient of a batch of that cluster alone, averaged "
        "with weight direction_beta per step), so a candidate exists for every cluster seen so far and "
        "carries more than the one or two prompts a batch holds. It splits every update's backward by cluster "
        "and keeps one gradient copy per cluster.",
    )
    direction_beta: float = Field(
        default=0.9, ge=0, lt=1,
        description="cluster_mean: the weight each step's direction keeps per update (0.9: about the last 10).",
    )
    lookahead_from_update: bool = Field(
        default=True,
        description="Asynchronous lookahead candidates reuse the gradients of the step's own update, run "
        "cluster by cluster (trainer_node/grpo/gradient_tap.py), instead of a second forward and backward "
        "pass on the background thread. It keeps one gradient copy per cluster of the batch; false "
        "recomputes the candidates (the same values, up to float rounding).",
    )
    selection: SerializeAsAny[UpdateRuleOptions] | None = Field(
        default=None,
        description="Update seam 1, after the advantages: which responses enter the loss (a per-response "
        "mask), e.g. { name = \"gfpo\", keep = 3 } or just \"gfpo\"; a registered selection rule "
        "(trainer_node.grpo.update_rules: difffilter, maxvar, gfpo, topk) typed by its options. None: "
        "every response.",
    )
    coefficients: SerializeAsAny[UpdateRuleOptions] | None = Field(
        default=None,
        description="The end of the advantage stage, before the seams: a registered coefficient module that "
        "recalibrates the training coefficients, e.g. { name = \"setgrpo\", beta = 0.08 } (SetGRPO for noisy "
        "graders, docs/SETGRPO.md; its ablations are options). None: the estimator's advantages.",
    )
    reweighting: SerializeAsAny[UpdateRuleOptions] | None = Field(
        default=None,
        description="Update seam 2, after the selection mask: per-response or per-token loss weights, "
        "rescaled to mean 1, e.g. { name = \"per\", alpha = 0.5 }; a registered reweighting rule (ar, per, "
        "softmax, diffband). None: weight 1.",
    )

    @field_validator("selection", "reweighting", "coefficients", mode="wrap")
    @classmethod
    def _typed_rule(cls, value: Any, handler: Any, info: ValidationInfo) -> UpdateRuleOptions | None:
        # Keyed on `name`: the seam's registry (plug-ins included) says which options model applies.
        if value is None:
            return None
        from trainer_node.grpo.update_seam import parse_rule_options

        return parse_rule_options(info.field_name, value)

    @field_validator("lookahead")
    @classmethod
    def _known_lookahead(cls, name: str) -> str:
        from trainer_node.grpo.lookahead import get_lookahead_optimizer

        get_lookahead_optimizer(name)  # raises, listing the known optimizers
        return name

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, name: str) -> str:
        from trainer_node.grpo.advantages import advantage_names

        if name not in advantage_names():
            raise ValueError(f"unknown advantage estimator {name!r}; known: {', '.join(advantage_names())}")
        return name

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        from trainer_node.grpo.losses import loss_names

        if name not in loss_names():
            raise ValueError(f"unknown policy loss {name!r}; known: {', '.join(loss_names())}")
        return name

    @field_validator("loss_aggregation")
    @classmethod
    def _known_aggregation(cls, name: str) -> str:
        from trainer_node.grpo.losses import aggregation_names

        if name not in aggregation_names():
            raise ValueError(f"unknown loss aggregation {name!r}; known: {', '.join(aggregation_names())}")
        return name

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError("both betas must be in [0, 1), e.g. [0.9, 0.999]")
        return betas

    @property
    def loss_settings(self) -> LossSettings:
        """What every registered loss reads (one signature over a typed batch)."""
        from trainer_node.grpo.losses import LossSettings

        return LossSettings(eps_low=self.eps_low, eps_high=self.eps_high, kl_coef=self.kl_coef,
                            aggregation=self.loss_aggregation)
