"""The two update seams (trainer_node/grpo/update_seam.py): one typed input for every rule, the
fixed order advantages -> selection mask -> weights, identity when no rule is set, the seed's
Eq. 1-2 in the loss, the typed options at the config edge, and the trainer's use of them."""

from __future__ import annotations

from typing import ClassVar, Literal

import pytest
import torch

from rlvr_core.configuration import ConfigError
from tests.trainer_node.dataflex_groups import make_input, row_weights
from tests.trainer_node.grpo_helpers import make_model_dir, make_settings, make_trainer, parameters
from trainer_node.config import parse_config
from trainer_node.grpo.batch import PolicyBatch
from trainer_node.grpo.losses import seq_mean, token_mean
from trainer_node.grpo.settings import GRPOSettings
from trainer_node.grpo.update_options import UpdateRuleOptions
from trainer_node.grpo.update_seam import (
    OPTIONAL_INPUTS,
    REWEIGHTINGS,
    SELECTIONS,
    ReweightingRule,
    SelectionRule,
    UpdateSeams,
    build_rule,
    nothing_kept,
    seam_metrics,
)

ALL_RULES = [("selection", n) for n in SELECTIONS.names()] + [("reweighting", n) for n in REWEIGHTINGS.names()]


def test_the_eight_dataflex_rules_are_registered_in_their_seams():
    assert SELECTIONS.names() == ["difffilter", "gfpo", "maxvar", "topk"]
    assert REWEIGHTINGS.names() == ["ar", "diffband", "per", "softmax"]


@pytest.mark.parametrize(("seam", "name"), ALL_RULES)
def test_every_rule_takes_the_one_input_and_returns_a_valid_intervention(seam, name):
    inputs = make_input([[1.0, 0.0, 0.5, 1.0, 0.0], [0.0] * 5, [0.2, 0.9, 0.4, 0.4, 1.0]],
                        lengths=[[1, 2, 3, 2, 1]] * 3, token_logprobs=[[-0.5] * 4] * 15)
    rule = build_rule(seam, name)
    assert rule.name == name and set(rule.requires) <= set(OPTIONAL_INPUTS)
    seams = UpdateSeams(**{seam: rule})
    factor = seams.token_factor(inputs)
    assert factor.shape == inputs.completion_mask.shape
    assert bool((factor >= 0).all()) and bool(torch.isfinite(factor).all())
    assert bool((factor[inputs.completion_mask == 0] == 0).all())
    assert torch.equal(factor, seams.token_factor(inputs))  # deterministic
    if seam == "selection":
        assert set(factor.unique().tolist()) <= {0.0, 1.0}
    else:
        kept_tokens = factor[inputs.completion_mask.bool()]
        if name == "ar":  # token weights: mean 1 over tokens; response weights: over responses
            assert float(kept_tokens.mean()) == pytest.approx(1.0, rel=1e-5)
        else:
            assert sum(row_weights(factor, inputs)) / inputs.size == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize(("seam", "name"), ALL_RULES)
def test_every_rule_documents_every_option_and_builds_from_its_defaults(seam, name):
    from rlvr_core.configuration import undocumented_fields
    from trainer_node.grpo.update_seam import SEAMS

    model = SEAMS[seam].options_model(name)
    assert issubclass(model, UpdateRuleOptions) and undocumented_fields(model) == []
    assert model().name == name


@pytest.mark.parametrize(("seam", "name"), ALL_RULES)
def test_every_rule_names_an_unknown_option_and_the_valid_ones(seam, name):
    with pytest.raises(ConfigError) as error:
        parse_config({"model": {"tiny": True}, "grpo": {seam: {"name": name, "no_such_option": 1}}})
    assert f"grpo.{seam}.no_such_option" in str(error.value) and "valid options" in str(error.value)


def test_unknown_rule_and_wrong_seam_are_named_at_config_load():
    with pytest.raises(ConfigError, match=r"grpo\.selection\.name: unknown selection rule 'per'; known: difffilter"):
        parse_config({"model": {"tiny": True}, "grpo": {"selection": "per"}})
    with pytest.raises(ConfigError, match=r"grpo\.reweighting\.alpha"):
        parse_config({"model": {"tiny": True}, "grpo": {"reweighting": {"name": "ar", "alpha": 2.0}}})
    with pytest.raises(ConfigError, match=r"grpo\.selection\.high: must be > low"):
        parse_config({"model": {"tiny": True}, "grpo": {"selection": {"name": "difffilter", "low": 0.5, "high": 0.5}}})


def test_a_rule_name_alone_is_its_table_and_resolves_every_default():
    config = parse_config({"model": {"tiny": True}, "grpo": {"selection": "gfpo", "reweighting": "per"}})
    resolved = config.to_json()["grpo"]
    assert resolved["selection"] == {"name": "gfpo", "keep": 3, "metric": "efficiency"}
    assert resolved["reweighting"] == {"name": "per", "alpha": 0.5, "eps": 1e-8}
    assert parse_config(config.to_json()).to_json() == config.to_json()  # resolved_config.json round-trips
    assert GRPOSettings().selection is None and GRPOSettings().reweighting is None


def test_no_rule_is_the_identity():
    inputs = make_input([[1.0, 0.0]])
    assert UpdateSeams().identity and UpdateSeams().token_factor(inputs) is None


def test_the_order_is_advantages_then_mask_then_weights_and_weights_see_only_kept_responses():
    """topk keeps the 2 largest |A| of 4; the reweighting rule then sees that mask, and its
    weights are rescaled to mean 1 over the kept responses only."""
    inputs = make_input([[1.0, 0.0, 0.0, 0.0]], advantages=[2.0, 1.0, 0.5, 0.0])
    seen = {}

    class Spy(ReweightingRule):
        name = "spy"

        def weights(self, inputs):
            seen["keep"] = inputs.keep.tolist()
            return inputs.advantages.abs()

    seams = UpdateSeams(selection=build_rule("selection", "topk"), reweighting=Spy(UpdateRuleOptions(name="spy")))
    factor = seams.token_factor(inputs)
    assert seen["keep"] == [True, True, False, False]
    assert row_weights(factor, inputs) == pytest.approx([2 * 2 / 3, 2 * 1 / 3, 0.0, 0.0])


def test_a_rule_that_returns_the_wrong_shape_or_a_negative_weight_is_named():
    class Bad(ReweightingRule):
        name = "bad"

        def weights(self, inputs):
            return -torch.ones(inputs.size)

    class Short(SelectionRule):
        name = "short"

        def keep(self, inputs):
            return torch.ones(1, dtype=torch.bool)

    inputs = make_input([[1.0, 0.0]])
    with pytest.raises(ValueError, match="'bad' returned a negative"):
        UpdateSeams(reweighting=Bad(UpdateRuleOptions(name="bad"))).token_factor(inputs)
    with pytest.raises(ValueError, match="'short' returned"):
        UpdateSeams(selection=Short(UpdateRuleOptions(name="short"))).token_factor(inputs)


def test_a_rule_needing_an_input_the_trainer_does_not_provide_is_refused_when_built():
    class Coefficients(ReweightingRule):  # SetGRPO-shaped: needs grader scores and gradient geometry
        requires: ClassVar[frozenset[str]] = frozenset({"grader_scores", "group_geometry"})

        def weights(self, inputs):
            return torch.ones(inputs.size)

    class CoefficientOptions(UpdateRuleOptions):
        name: Literal["coefficients"] = "coefficients"

    registry = REWEIGHTINGS.copy()
    registry.add("coefficients", Coefficients, options=CoefficientOptions)
    import trainer_node.grpo.update_seam as seam_module

    original = seam_module.SEAMS["reweighting"]
    seam_module.SEAMS["reweighting"] = registry
    try:
        with pytest.raises(ValueError, match="needs grader_scores, group_geometry, which this trainer does not"):
            build_rule("reweighting", "coefficients")
    finally:
        seam_module.SEAMS["reweighting"] = original


def _batch(factor: torch.Tensor | None, mask: torch.Tensor) -> PolicyBatch:
    n, t = mask.shape
    return PolicyBatch(input_ids=torch.zeros(n, t, dtype=torch.long), attention_mask=torch.ones(n, t, dtype=torch.long),
                       completion_mask=mask, advantages=torch.zeros(n), token_weights=factor)


def test_seq_mean_with_the_seam_factor_is_the_seeds_eq_1_and_eq_2():
    """L = 1/(GK) sum_gk (1/L_gk) sum_l m_gk w_gkl loss_gkl: the response length L and the count
    GK are those of the whole batch; a dropped response still counts in GK (Eq. 1)."""
    inputs = make_input([[1.0, 0.0], [1.0, 0.0]], lengths=[[1, 3], [2, 2]])
    mask = inputs.completion_mask
    loss_tok = torch.arange(mask.numel(), dtype=torch.float32).view_as(mask) / 10
    factor = torch.tensor([[0, 1, 0, 0], [0, 2, 2, 2], [0, 0, 0, 0], [0, 0.5, 0.5, 0]], dtype=torch.float32) * mask
    expected = 0.0
    for row in range(4):
        length = float(mask[row].sum())
        expected += float((factor[row] * loss_tok[row]).sum()) / length
    expected /= 4
    assert float(seq_mean(loss_tok, _batch(factor, mask))) == pytest.approx(expected)
    assert float(seq_mean(loss_tok, _batch(None, mask))) == pytest.approx(
        sum(float((mask[r] * loss_tok[r]).sum()) / float(mask[r].sum()) for r in range(4)) / 4)
    total_tokens = float(mask.sum())
    assert float(token_mean(loss_tok, _batch(factor, mask))) == pytest.approx(
        float((factor * loss_tok).sum()) / total_tokens)


def test_seam_metrics_and_nothing_kept():
    inputs = make_input([[1.0, 0.0, 0.0, 0.0]], advantages=[2.0, 1.0, 0.5, 0.0])
    factor = UpdateSeams(selection=build_rule("selection", "topk")).token_factor(inputs)
    batch = _batch(factor, inputs.completion_mask)
    assert seam_metrics(batch)["update/kept_frac"] == 0.5 and not nothing_kept(batch)
    assert nothing_kept(_batch(torch.zeros_like(factor), inputs.completion_mask))
    assert seam_metrics(_batch(None, inputs.completion_mask)) == {} and not nothing_kept(_batch(None, inputs.completion_mask))


# --- the trainer -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("seam_model"))


def test_no_rule_leaves_the_trainers_batch_untouched(model_dir):
    trainer = make_trainer(model_dir)
    assert trainer.update_seams.identity
    groups = trainer.sample_and_rollout(0).groups
    assert trainer.build_batch(groups).token_weights is None


@pytest.mark.parametrize(("seam", "name"), ALL_RULES)
def test_every_rule_trains_a_step_and_logs_what_it_kept(model_dir, seam, name):
    trainer = make_trainer(model_dir, settings=make_settings(**{seam: name}), rollouts=5)
    before = parameters(trainer)
    record = trainer.train_step()
    assert record["update_skipped"] in (0.0, 1.0)
    assert 0.0 <= record["update/kept_frac"] <= 1.0
    if record["update_skipped"] == 0.0:
        assert any(not torch.equal(before[k], v) for k, v in parameters(trainer).items())
    if name == "topk":
        assert record["update/kept_frac"] == pytest.approx(0.5)


def test_a_step_whose_mask_keeps_nothing_is_skipped_and_leaves_the_weights(model_dir):
    # q takes values k/4 with 4 rollouts: no group lies strictly between 0.98 and 0.99.
    settings = make_settings(selection={"name": "difffilter", "low": 0.98, "high": 0.99})
    trainer = make_trainer(model_dir, settings=settings, rollouts=4)
    before = parameters(trainer)
    record = trainer.train_step()
    assert record["update_skipped"] == 1.0 and record["update/kept_frac"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in parameters(trainer).items())


def test_the_selection_mask_changes_the_gradient_exactly_as_dropping_the_rows_would(model_dir):
    """A masked response contributes nothing: the loss equals the loss with its weight set to 0
    through L2RR's sample weights (the same linear hook), normalisers unchanged (Eq. 1)."""
    trainer = make_trainer(model_dir, settings=make_settings(selection="topk", loss_aggregation="seq_mean"),
                           rollouts=4)
    groups = trainer.sample_and_rollout(0).groups
    masked = trainer.build_batch(groups)
    keep = (masked.token_weights.sum(dim=1) > 0).float()
    plain = make_trainer(model_dir, settings=make_settings(loss_aggregation="seq_mean"), rollouts=4)
    unmasked = plain.build_batch(groups)
    loss_masked, _ = trainer.micro_batch_loss(masked)
    from dataclasses import replace

    loss_dropped, _ = plain.micro_batch_loss(replace(unmasked, sample_weights=keep))
    assert float(loss_masked.detach()) == pytest.approx(float(loss_dropped.detach()), abs=1e-6)
    assert 0 < float(keep.sum()) < keep.numel()
