"""One-step lookahead updates that leave the live model and optimizer untouched.

L2RR scores a candidate data reweighting by the target accuracy of the model ONE update
after training on the reweighted batch. Two step rules, chosen by grpo.lookahead:

- "adamw" (default): replay exactly what the live AdamW would do next, from a copy of its
  state (exp_avg, exp_avg_sq, step). A candidate with all weights 1 then equals the real
  next update, so the owner scores the update that will actually be taken. Adam's
  per-coordinate normalisation also keeps candidates of different total weight comparable.
- "sgd": p - lr * g. Cheaper (no state reads) but its step size depends on gradient scale.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

StepRule = Callable[[torch.nn.Parameter, torch.Tensor, "LookaheadHyper", dict], torch.Tensor]


class LookaheadHyper:
    def __init__(self, lr: float, betas: tuple[float, float], eps: float, weight_decay: float):
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay


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


def sgd_step(param: torch.Tensor, grad: torch.Tensor, hyper: LookaheadHyper, state: dict) -> torch.Tensor:
    return param - hyper.lr * grad


STEP_RULES: dict[str, StepRule] = {"adamw": adamw_step, "sgd": sgd_step}


def clip_gradients(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """Scale like torch.nn.utils.clip_grad_norm_ (same formula), out of place."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return [g * scale for g in grads]


def stepped_state_dict(
    model: torch.nn.Module,
    grads: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    rule: str,
    hyper: LookaheadHyper,
) -> dict[str, torch.Tensor]:
    """The model's full state dict after one step with `grads`; tied tensors stay tied by value."""
    if rule not in STEP_RULES:
        raise ValueError(f"unknown lookahead rule {rule!r}; known: {', '.join(sorted(STEP_RULES))}")
    step_fn = STEP_RULES[rule]
    updated: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            grad = grads.get(name)
            if grad is None:
                grad = torch.zeros_like(param)
            updated[id(param)] = step_fn(param.detach(), grad, hyper, optimizer.state.get(param, {}))
        out: dict[str, torch.Tensor] = {}
        for key, tensor in model.state_dict(keep_vars=True).items():
            out[key] = updated[id(tensor)].clone() if id(tensor) in updated else tensor.detach().clone()
    return out
