import math

import pytest
import torch

from trainer_node.grpo.batch import PolicyBatch
from trainer_node.grpo.losses import (
    AGGREGATIONS,
    LOSSES,
    LossSettings,
    aggregation_names,
    get_aggregation,
    get_loss,
    k3_kl,
    loss_names,
)

LOSS = get_loss("ppo_clip")


def make_batch(old_ratio_rows, advantages, mask_rows, **kw):
    """logprobs = 0 everywhere; old = -log(ratio) so that exp(logp - old) = ratio."""
    ratios = torch.tensor(old_ratio_rows, dtype=torch.float64)
    mask = torch.tensor(mask_rows, dtype=torch.float64)
    batch = PolicyBatch(
        input_ids=torch.zeros(mask.shape, dtype=torch.long),
        attention_mask=torch.ones(mask.shape, dtype=torch.long),
        completion_mask=mask,
        advantages=torch.tensor(advantages, dtype=torch.float64),
        old_logprobs=-torch.log(ratios),
        **kw,
    )
    logprobs = torch.zeros(mask.shape, dtype=torch.float64, requires_grad=True)
    return logprobs, batch


def test_clip_higher_on_both_sides_token_mean():
    # Row 0 (A=+1): ratio 1.5 -> clipped at 1+0.28; ratio 0.5 -> unclipped (min picks 0.5).
    # Row 1 (A=-1): ratio 0.5 -> clipped at 1-0.2 (loss 0.8); ratio 1.5 -> unclipped (loss 1.5).
    logprobs, batch = make_batch([[1.0, 1.5, 0.5], [1.0, 0.5, 1.5]], [1.0, -1.0], [[0, 1, 1], [0, 1, 1]])
    out = LOSS(logprobs, batch, LossSettings(eps_low=0.2, eps_high=0.28, aggregation="token_mean"))
    per_token = [-1.28, -0.5, 0.8, 1.5]
    assert out.loss.item() == pytest.approx(sum(per_token) / 4)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 4)
    out.loss.backward()
    # Clipped tokens get no gradient; unclipped ones get -A * ratio / N.
    expected_grad = torch.tensor([[0, 0, -0.5 / 4], [0, 0, 1.5 / 4]], dtype=torch.float64)
    assert torch.allclose(logprobs.grad, expected_grad)


def test_token_mean_vs_seq_mean_with_unequal_lengths():
    # On-policy (ratio 1): loss_tok = -A. Row 0 has 3 completion tokens, row 1 has 1.
    logprobs, batch = make_batch([[1, 1, 1, 1], [1, 1, 1, 1]], [1.0, -2.0], [[0, 1, 1, 1], [0, 0, 0, 1]])
    token = LOSS(logprobs, batch, LossSettings(aggregation="token_mean")).loss
    seq = LOSS(logprobs, batch, LossSettings(aggregation="seq_mean")).loss
    assert token.item() == pytest.approx((3 * -1.0 + 1 * 2.0) / 4)
    assert seq.item() == pytest.approx((-1.0 + 2.0) / 2)


def test_on_policy_without_old_logprobs_has_ratio_one_gradient():
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    batch = PolicyBatch(
        input_ids=torch.zeros((1, 3), dtype=torch.long), attention_mask=torch.ones((1, 3), dtype=torch.long),
        completion_mask=mask, advantages=torch.tensor([2.0]),
    )
    logprobs = torch.tensor([[0.0, -0.3, -1.2]], requires_grad=True)
    out = LOSS(logprobs, batch, LossSettings())
    assert out.loss.item() == pytest.approx(-2.0)
    out.loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -1.0, -1.0]]))


def test_k3_kl_value_and_loss_term():
    logp, ref = math.log(0.5), math.log(0.25)
    expected = 0.5 - math.log(0.5) - 1.0  # exp(ref-logp) - (ref-logp) - 1
    assert float(k3_kl(torch.tensor(logp), torch.tensor(ref))) == pytest.approx(expected)
    mask = torch.tensor([[0.0, 1.0]])
    batch = PolicyBatch(
        input_ids=torch.zeros((1, 2), dtype=torch.long), attention_mask=torch.ones((1, 2), dtype=torch.long),
        completion_mask=mask, advantages=torch.tensor([0.0]), ref_logprobs=torch.tensor([[0.0, ref]]),
    )
    out = LOSS(torch.tensor([[0.0, logp]]), batch, LossSettings(kl_coef=0.1))
    assert out.loss.item() == pytest.approx(0.1 * expected)
    assert out.metrics["kl"] == pytest.approx(expected)
    with pytest.raises(ValueError, match="ref_logprobs"):
        LOSS(torch.zeros((1, 2)), PolicyBatch(batch.input_ids, batch.attention_mask, mask, batch.advantages),
             LossSettings(kl_coef=0.1))


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_micro_batches_add_up_to_full_batch(aggregation):
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand((6, 5), generator=gen) > 0.3).double()
    mask[:, 0] = 0
    batch = PolicyBatch(
        input_ids=torch.zeros((6, 5), dtype=torch.long), attention_mask=torch.ones((6, 5), dtype=torch.long),
        completion_mask=mask, advantages=torch.randn(6, generator=gen, dtype=torch.float64),
        old_logprobs=torch.randn((6, 5), generator=gen, dtype=torch.float64) * 0.2,
    )
    logprobs = torch.randn((6, 5), generator=gen, dtype=torch.float64) * 0.2
    settings = LossSettings(aggregation=aggregation)
    full = LOSS(logprobs, batch, settings).loss.item()
    parts = batch.split(4)
    rows = [0] + list(torch.cumsum(torch.tensor([p.size for p in parts]), 0))
    summed = sum(LOSS(logprobs[a:b], p, settings).loss.item() for p, a, b in zip(parts, rows[:-1], rows[1:]))
    assert summed == pytest.approx(full, abs=1e-12)


def test_sample_weights_scale_rows_and_zero_drops_them():
    logprobs, batch = make_batch([[1, 1, 1], [1, 1, 1]], [1.0, -3.0], [[0, 1, 1], [0, 1, 1]])
    plain = LOSS(logprobs, batch, LossSettings()).loss.item()
    ones = LOSS(logprobs, PolicyBatch(**{**batch.__dict__, "sample_weights": torch.ones(2)}), LossSettings()).loss.item()
    drop = LOSS(logprobs, PolicyBatch(**{**batch.__dict__, "sample_weights": torch.tensor([1.0, 0.0])}),
                LossSettings()).loss.item()
    assert ones == pytest.approx(plain)
    assert drop == pytest.approx(2 * -1.0 / 4)  # row 1 dropped, normaliser unchanged


def test_registries_reject_duplicates_and_list_names():
    with pytest.raises(ValueError, match="policy loss 'ppo_clip' is already registered"):
        LOSSES.register("ppo_clip")(LOSS)
    with pytest.raises(ValueError, match="loss aggregation 'token_mean' is already registered"):
        AGGREGATIONS.register("token_mean")(get_aggregation("token_mean"))
    with pytest.raises(ValueError, match="unknown policy loss 'reinforce'; known: ppo_clip"):
        get_loss("reinforce")
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'; known: seq_mean, token_mean"):
        get_aggregation("sum")
    assert (LOSSES.entry_point_group, AGGREGATIONS.entry_point_group) == (
        "target_feedback.losses", "target_feedback.loss_aggregations")


def _ragged_batch():
    logprobs, batch = make_batch(
        [[1.0, 1.2, 0.7, 1.0], [1.0, 0.9, 1.0, 1.0], [1.0, 1.4, 0.6, 0.8], [1.0, 1.0, 1.1, 1.0]],
        [0.5, -1.0, 2.0, -0.3],
        [[0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1]],
    )
    return logprobs, batch


@pytest.mark.parametrize("loss", loss_names())
@pytest.mark.parametrize("aggregation", aggregation_names())
def test_every_loss_and_aggregation_adds_up_over_micro_batches(loss, aggregation):
    # The contract the trainer's grad accumulation relies on, for every pair of entries.
    logprobs, batch = _ragged_batch()
    settings = LossSettings(aggregation=aggregation)
    full = get_loss(loss)(logprobs, batch, settings)
    assert full.loss.dim() == 0 and full.loss.requires_grad
    parts, start, summed = batch.split(2), 0, 0.0
    for part in parts:
        summed += get_loss(loss)(logprobs[start : start + part.size], part, settings).loss.item()
        start += part.size
    assert summed == pytest.approx(full.loss.item(), abs=1e-12)
