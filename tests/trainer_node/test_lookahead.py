"""The lookahead optimizers (grpo/lookahead.py): one registry, one step-rule signature, and the
trainer asks the entry for its step instead of comparing names."""

from __future__ import annotations

import pytest
import torch

from tests.trainer_node.grpo_helpers import make_model_dir, make_settings, make_trainer
from trainer_node.grpo import lookahead
from trainer_node.grpo.lookahead import (
    LOOKAHEAD_OPTIMIZERS,
    LookaheadHyper,
    get_lookahead_optimizer,
    lookahead_optimizer_names,
)
from trainer_node.grpo.settings import GRPOSettings

HYPER = LookaheadHyper(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("lookahead"))


def test_builtin_optimizers_and_unknown_names():
    assert lookahead_optimizer_names() == ["adam_preconditioned", "adamw", "sgd"]
    assert LOOKAHEAD_OPTIMIZERS.entry_point_group == "target_feedback.lookahead_optimizers"
    with pytest.raises(ValueError, match="unknown lookahead optimizer 'adam'; known: adam_preconditioned, adamw, sgd"):
        get_lookahead_optimizer("adam")
    with pytest.raises(ValueError, match="lookahead optimizer 'sgd' is already registered"):
        LOOKAHEAD_OPTIMIZERS.register("sgd")(lookahead.sgd_step)


@pytest.mark.parametrize("name", lookahead_optimizer_names())
def test_every_rule_is_out_of_place_and_still_at_a_zero_gradient(name):
    rule = get_lookahead_optimizer(name)
    param, grad = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    state = {"step": torch.tensor(3.0), "exp_avg": torch.randn(5).double(), "exp_avg_sq": torch.rand(5).double()}
    copies = (param.clone(), grad.clone(), {k: v.clone() for k, v in state.items()})
    stepped = rule(param, grad, HYPER, state)
    assert stepped.shape == param.shape and not torch.equal(stepped, param)
    assert torch.equal(param, copies[0]) and torch.equal(grad, copies[1])
    assert all(torch.equal(state[k], copies[2][k]) for k in state)
    no_decay = LookaheadHyper(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    assert torch.equal(rule(param, torch.zeros_like(param), no_decay, {}), param)


def test_adamw_rule_is_torch_adamw_from_a_state_copy():
    param = torch.nn.Parameter(torch.randn(4, dtype=torch.float64))
    optimizer = torch.optim.AdamW([param], lr=HYPER.lr, betas=HYPER.betas, eps=HYPER.eps, weight_decay=0.01)
    for _ in range(2):
        param.grad = torch.randn(4, dtype=torch.float64)
        optimizer.step()
    grad = torch.randn(4, dtype=torch.float64)
    predicted = get_lookahead_optimizer("adamw")(param.detach(), grad, HYPER, optimizer.state[param])
    param.grad = grad
    optimizer.step()
    assert torch.allclose(predicted, param.detach(), atol=1e-12)


def test_adam_preconditioned_is_adamws_scale_without_momentum_or_decay():
    rule = get_lookahead_optimizer("adam_preconditioned")
    param, grad = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    first = rule(param, grad, HYPER, {})  # no state yet: AdamW's first step, lr * sign(g)
    assert torch.allclose(first, param - HYPER.lr * torch.sign(grad), atol=1e-6)
    state = {"step": torch.tensor(4.0), "exp_avg": torch.randn(4).double(), "exp_avg_sq": torch.rand(4).double()}
    v_hat = state["exp_avg_sq"] / (1 - 0.999**4)
    assert torch.allclose(rule(param, grad, HYPER, state), param - HYPER.lr * grad / (v_hat.sqrt() + HYPER.eps))
    assert torch.allclose(rule(param, -grad, HYPER, state) - param, -(rule(param, grad, HYPER, state) - param))


def test_sgd_rule_ignores_weight_decay():
    param, grad = torch.ones(3), torch.full((3,), 2.0)
    assert torch.equal(get_lookahead_optimizer("sgd")(param, grad, HYPER, {}), torch.full((3,), 0.8))


def test_settings_refuse_an_unknown_optimizer():
    # GRPOSettings is the [grpo] section itself: the name is checked once, when settings are built.
    assert GRPOSettings(lookahead="sgd").lookahead == "sgd"
    with pytest.raises(ValueError, match="unknown lookahead optimizer 'lbfgs'; known: adam_preconditioned, adamw, sgd"):
        GRPOSettings(lookahead="lbfgs")
    with pytest.raises(ValueError, match="unknown lookahead optimizer 'lbfgs'"):
        make_settings(lookahead="lbfgs")


def test_a_registered_optimizer_is_used_by_the_trainer_without_naming_it(model_dir, monkeypatch):
    scratch = LOOKAHEAD_OPTIMIZERS.copy()
    monkeypatch.setattr(lookahead, "LOOKAHEAD_OPTIMIZERS", scratch)
    calls = []

    @scratch.register("frozen")
    def frozen_step(param, grad, hyper, state):
        calls.append(hyper.weight_decay)
        return param.clone()

    trainer = make_trainer(model_dir, make_settings(lookahead="frozen", weight_decay=0.05))
    groups = trainer.sample_and_rollout(0).groups
    (stepped,) = trainer.lookahead_state_dicts(groups, [[1.0] * len(groups)])
    live = trainer.current_state_dict()
    assert all(torch.equal(live[k], stepped[k]) for k in live)
    assert calls and set(calls) == {0.05}, "every rule gets the live weight decay; the rule decides"
