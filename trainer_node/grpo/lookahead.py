"""One-step lookahead updates that leave the live model and optimizer untouched.

L2RR scores a candidate data reweighting by the target accuracy of the model ONE update
after training on the reweighted batch. The step is taken by a lookahead optimizer from the
`LOOKAHEAD_OPTIMIZERS` registry, chosen by grpo.lookahead:

- "adamw" (default): replay exactly what the live AdamW would do next, from a copy of its
  state (exp_avg, exp_avg_sq, step), weight decay included. A candidate with all weights 1
  then equals the real next update, so the owner scores the update that will actually be
  taken. Adam's per-coordinate normalisation also keeps candidates of different total weight
  comparable.
- "sgd": p - lr * g, no weight decay. Cheaper (no state reads) but its step size depends on
  gradient scale.
- "adam_preconditioned": p - lr * g / (sqrt(v_hat) + eps), the live AdamW's per-coordinate scale
  without its momentum: candidates differ from the base by their own gradients only, which is
  what a difference release (docs/L2RR.md 4.1) measures; an AdamW candidate's shared momentum
  would take most of each row's clip range.

Each entry is a step rule `(param, grad, hyper, optimizer_state) -> new param`, computed out of
place; the rule alone decides what of `hyper` and of the live optimizer's state it uses, so the
trainer passes every rule the same input. To add one:
    @LOOKAHEAD_OPTIMIZERS.register("mine")
    def mine_step(param, grad, hyper: LookaheadHyper, state: dict) -> torch.Tensor: ...
and select it with `grpo.lookahead = "mine"` (a plug-in: entry point `target_feedback.lookahead_optimizers`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from protocol.plugins import Registry, callable_entries

StepRule = Callable[[torch.Tensor, torch.Tensor, "LookaheadHyper", dict], torch.Tensor]
# The rules are defined below, so the registry needs no lazy built-ins.
LOOKAHEAD_OPTIMIZERS: Registry[StepRule] = Registry(
    "lookahead_optimizers", noun="lookahead optimizer", on_add=callable_entries("lookahead optimizer")
)


def lookahead_optimizer_names() -> list[str]:
    return LOOKAHEAD_OPTIMIZERS.names()


def get_lookahead_optimizer(name: str) -> StepRule:
    """The step rule registered as `name`; ValueError listing the known ones."""
    return LOOKAHEAD_OPTIMIZERS.get(name)


class LookaheadHyper:
    """The live optimizer's hyperparameters (a rule reads what it needs: SGD only `lr`)."""

    def __init__(self, lr: float, betas: tuple[float, float], eps: float, weight_decay: float):
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay


@LOOKAHEAD_OPTIMIZERS.register("adamw")
def adamw_step(param: torch.Tensor, grad: torch.Tensor, hyper: LookaheadHyper, state: dict) -> torch.Tensor:
    """torch.optim.AdamW's update (amsgrad off), computed out of place from a state copy."""
    beta1, beta2 = hyper.betas
    step = float(state["step"]) + 1 if "step" in state else 1.0
    exp_avg = state.get("exp_avg", torch.zeros_like(param)) * beta1 + grad * (1 - beta1)
    exp_avg_sq = state.get("exp_avg_sq", torch.zeros_like(param)) * beta2 + grad * grad * (1 - beta2)
    bias1 = 1 - beta1**step
    bias2 = 1 - beta2**step
    denom = exp_avg_sq.sqrt() / (bias2**0.5) + hyper.eps
    decayed = param * (1 - hyper.lr * hyper.weight_decay)
    return decayed - (hyper.lr / bias1) * exp_avg / denom


@LOOKAHEAD_OPTIMIZERS.register("sgd")
def sgd_step(param: torch.Tensor, grad: torch.Tensor, hyper: LookaheadHyper, state: dict) -> torch.Tensor:
    """Plain SGD: p - lr * g (no weight decay, no optimizer state)."""
    return param - hyper.lr * grad


@LOOKAHEAD_OPTIMIZERS.register("adam_preconditioned")
def adam_preconditioned_step(param: torch.Tensor, grad: torch.Tensor, hyper: LookaheadHyper,
                             state: dict) -> torch.Tensor:
    """p - lr * g / (sqrt(v_hat) + eps): the live AdamW's per-coordinate scale (its bias-corrected second
    moment), without its momentum or weight decay. Every candidate of a query then differs from the
    base by its own gradient alone, the part the momentum they would all share hides, and moves about
    as far per coordinate as an AdamW step. With no state yet (the first step) v_hat = g^2, the size of
    AdamW's first step."""
    if "exp_avg_sq" in state and float(state.get("step", 0)) > 0:
        beta2 = hyper.betas[1]
        second = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
    else:
        second = grad * grad
    return param - hyper.lr * grad / (second.sqrt() + hyper.eps)


def clip_gradients(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """Scale like torch.nn.utils.clip_grad_norm_ (same formula), out of place."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return [g * scale for g in grads]


def stepped_state_dict(
    model: torch.nn.Module,
    grads: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | Mapping[str, dict],
    step_fn: StepRule,
    hyper: LookaheadHyper,
) -> dict[str, torch.Tensor]:
    """The model's full state dict after one `step_fn` step with `grads`; tied tensors stay tied by value.

    Tensors the step does not touch (frozen weights, buffers) are the live ones, not copies: a
    LoRA model's base is then neither copied per candidate nor serialized again by the writer.
    `optimizer` is the live optimizer, or its per-parameter state by parameter name (a snapshot)."""
    updated: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            grad = grads.get(name)
            if grad is None:
                grad = torch.zeros_like(param)
            state = optimizer.get(name, {}) if isinstance(optimizer, Mapping) else optimizer.state.get(param, {})
            updated[id(param)] = step_fn(param.detach(), grad, hyper, state)
        out: dict[str, torch.Tensor] = {}
        for key, tensor in model.state_dict(keep_vars=True).items():
            out[key] = updated[id(tensor)].clone() if id(tensor) in updated else tensor.detach()
    return out
