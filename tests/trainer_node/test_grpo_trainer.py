import json
import math

import numpy as np
import pytest
import torch

from tests.trainer_node.grpo_helpers import make_model_dir, make_settings, make_trainer, parameters, toy_pool
from trainer_node.grpo.rollout import generation_seed, overlong_penalty
from trainer_node.policies.base import RolloutRequest, StepRollouts
from trainer_node.policies.uniform import UniformOptions, UniformPolicy
from trainer_node.run_output import RunOutput, read_metrics, write_plots


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("grpo"))


def test_three_step_run_counts_rollouts_and_writes_outputs(model_dir, tmp_path):
    trainer = make_trainer(model_dir)
    before = parameters(trainer)
    output = RunOutput(tmp_path / "run", total_steps=3, progress=False)
    seen = []
    trainer.on_step_end = lambda step, record: seen.append(step)
    for _ in range(3):
        output.log_step(trainer.train_step())
    output.log_eval({"name": "source_eval", "step": 3, "rollouts_cumulative": trainer.rollouts_cumulative,
                     "accuracy": 0.25})
    summary = output.close(print_table=False)

    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in records] == [0, 1, 2] and seen == [0, 1, 2]
    assert all(math.isfinite(r["loss"]) and r["rollouts_step"] == 16 for r in records)
    assert [r["rollouts_cumulative"] for r in records] == [16, 32, 48]
    assert all(r["groups_total"] == 4 and r["groups_filtered"] == 0 for r in records)
    assert summary["rollouts_cumulative"] == 48 and summary["source_eval/accuracy_last"] == 0.25
    for name in ("reward_vs_step.png", "accuracy_vs_rollouts.png", "summary.json"):
        assert (tmp_path / "run" / name).stat().st_size > 0
    after = parameters(trainer)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_lookahead_leaves_live_state_alone_and_predicts_the_real_update(model_dir):
    trainer = make_trainer(model_dir, make_settings(adam_eps=1e-4))  # eps: see the accumulation test
    trainer.train_step()  # non-empty AdamW state, so the lookahead must read it
    groups = trainer.sample_and_rollout(1).groups
    live = parameters(trainer)
    adam_steps = [float(s["step"]) for s in trainer.optimizer.state.values()]

    informative = next(i for i, g in enumerate(groups) if not g.zero_variance)
    dropped = [0.0 if i == informative else 1.0 for i in range(len(groups))]
    ones, drop_one = trainer.lookahead_state_dicts(groups, [[1.0] * len(groups), dropped])

    assert all(torch.equal(live[k], v) for k, v in parameters(trainer).items())
    assert [float(s["step"]) for s in trainer.optimizer.state.values()] == adam_steps
    assert all(p.grad is None for p in trainer.model.parameters())
    assert set(ones) == set(live)
    assert any(not torch.allclose(ones[k], drop_one[k]) for k in ones)
    trainer.update(groups)
    real = parameters(trainer)
    assert max(float((ones[k] - real[k]).abs().max()) for k in real) < 1e-6


def test_lookahead_on_kept_rows_equals_the_zero_weighted_full_batch(model_dir):
    # A one-cluster candidate runs forward/backward on that cluster's rows only, with the whole
    # batch's normalisers: the same step as the full batch with the other groups weighted 0.
    trainer = make_trainer(model_dir, make_settings(adam_eps=1e-4, grad_accum_steps=2))
    trainer.train_step()
    groups = trainer.sample_and_rollout(1).groups
    one_hot = [1.0 if i % 2 == 0 else 0.0 for i in range(len(groups))]
    (split,) = trainer.lookahead_state_dicts(groups, [one_hot])

    base = trainer.build_batch(groups).with_normalisers()
    weighted = base.__class__(**{**base.__dict__, "sample_weights": torch.tensor(one_hot)[base.group_ids]})
    named = [(n, p) for n, p in trainer.model.named_parameters() if p.requires_grad]
    from trainer_node.grpo.lookahead import LookaheadHyper, clip_gradients, stepped_state_dict

    grads = clip_gradients(trainer._gradients(weighted, [p for _, p in named]), trainer.settings.max_grad_norm)
    s = trainer.settings
    full = stepped_state_dict(trainer.model, {n: g for (n, _), g in zip(named, grads)}, trainer.optimizer,
                              trainer.lookahead_step, LookaheadHyper(s.lr, s.betas, s.adam_eps, s.weight_decay))
    assert max(float((split[k] - full[k]).abs().max()) for k in full) < 1e-6
    (nothing,) = trainer.lookahead_state_dicts(groups, [[0.0] * len(groups)])  # no rows: a zero-gradient step
    assert set(nothing) == set(full)


def test_step_records_time_per_phase(model_dir):
    from trainer_node.grpo.timing import PHASES

    trainer = make_trainer(model_dir)
    record = trainer.train_step()
    times = {name: record[f"time/{name}"] for name in PHASES}
    assert all(value >= 0 for value in times.values())
    assert times["generation"] > 0 and times["update"] > 0 and times["reward"] > 0
    assert times["candidates"] == times["upload"] == times["owner_wait"] == 0.0  # no feedback
    assert sum(times.values()) == pytest.approx(record["step_seconds"], rel=0.05, abs=5e-3)


def test_sgd_lookahead_steps_against_the_gradient(model_dir):
    trainer = make_trainer(model_dir, make_settings(lookahead="sgd", lookahead_lr=0.5))
    groups = trainer.sample_and_rollout(0).groups
    live = parameters(trainer)
    (stepped,) = trainer.lookahead_state_dicts(groups, [[1.0] * len(groups)])
    assert any(not torch.equal(live[k], stepped[k]) for k in live)
    with pytest.raises(ValueError, match="entries for"):
        trainer.lookahead_state_dicts(groups, [[1.0]])


class FilterEverything(UniformPolicy):
    def training_groups(self, step, so_far):
        return []


class RaggedRollouts(UniformPolicy):
    """Two rounds: prompts 0-2 with n = 2, 3, 4, then prompt 0 again with n = 2 (merged)."""

    def next_requests(self, step, so_far: StepRollouts):
        if so_far.rounds == 0:
            return [RolloutRequest(0, 2), RolloutRequest(1, 3), RolloutRequest(2, 4)]
        if so_far.rounds == 1:
            return [RolloutRequest(0, 2)]
        return []


def _with_policy(trainer, policy_class):
    trainer.policy = policy_class(toy_pool(), UniformOptions(batch_size=4, rollouts_per_prompt=4), np.random.default_rng(0))
    return trainer


def test_empty_batch_skips_the_update(model_dir):
    trainer = _with_policy(make_trainer(model_dir), FilterEverything)
    before = parameters(trainer)
    record = trainer.train_step()
    assert record["update_skipped"] == 1.0 and record["groups_filtered"] == 4
    assert record["rollouts_cumulative"] == 16  # generation still counts
    assert all(torch.equal(before[k], v) for k, v in parameters(trainer).items())


def test_ragged_groups_across_rounds(model_dir):
    trainer = _with_policy(make_trainer(model_dir), RaggedRollouts)
    record = trainer.train_step()
    assert record["rollouts_step"] == 2 + 3 + 4 + 2
    assert record["groups_total"] == 3 and record["generation_rounds"] == 2
    assert math.isfinite(record["loss"]) and record["train_rollouts"] == 11


def test_gradient_accumulation_equals_one_big_batch(model_dir):
    # adam_eps 1e-4: Adam's first step is ~ g / (|g| + eps), which would blow float noise in
    # near-zero gradients up to lr-sized differences with the default 1e-8.
    one = make_trainer(model_dir, make_settings(grad_accum_steps=1, adam_eps=1e-4))
    three = make_trainer(model_dir, make_settings(grad_accum_steps=3, adam_eps=1e-4))
    groups = one.sample_and_rollout(0).groups
    loss_one, loss_three = one.update(groups)["loss"], three.update(groups)["loss"]
    assert loss_three == pytest.approx(loss_one, abs=1e-6)
    a, b = parameters(one), parameters(three)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


@pytest.mark.parametrize("accum", [1, 2])
def test_an_update_run_class_by_class_for_a_gradient_tap_is_the_same_update(model_dir, accum):
    """grpo/gradient_tap.py: a snapshot's tap makes the next update run its backward class by
    class. The update is the same (up to the order of the additions), its metrics are, and the
    class gradients the tap keeps add up to the batch's gradient."""
    plain = make_trainer(model_dir, make_settings(grad_accum_steps=accum, adam_eps=1e-4))
    tapped = make_trainer(model_dir, make_settings(grad_accum_steps=accum, adam_eps=1e-4))
    groups = plain.sample_and_rollout(0).groups
    weights = [[1.0 if i % 2 else 0.0 for i in range(len(groups))], [0.5] * len(groups)]
    snapshot = tapped.lookahead_snapshot(groups, weights)
    assert snapshot.tap is not None and not snapshot.tap.resolved and snapshot.tap.classes == 2
    a, b = plain.update(groups), tapped.update(groups)
    assert snapshot.tap.wait(), "the update filled the tap"
    assert b["lookahead_tapped"] == 1.0 and "lookahead_tapped" not in a
    assert b["loss"] == pytest.approx(a["loss"], abs=1e-6) and b["entropy"] == pytest.approx(a["entropy"], abs=1e-6)
    x, y = parameters(plain), parameters(tapped)
    assert max(float((x[k] - y[k]).abs().max()) for k in x) < 1e-6
    # candidate 1 weighs every group 0.5: half the sum of the class gradients, i.e. half the batch's
    total = [sum(g[i] for g in snapshot.tap._gradients) for i in range(len(snapshot.tap._gradients[0]))]
    half = snapshot.tap.candidate_gradient(1)
    assert all(torch.allclose(h, 0.5 * t, atol=1e-7) for h, t in zip(half, total))


def test_an_update_that_fails_still_resolves_its_tap(model_dir, monkeypatch):
    """The background thread waits for the tap: an error in the update must decline it (it would
    otherwise wait forever), and so must a step that fails before its update."""
    trainer = make_trainer(model_dir)
    groups = trainer.sample_and_rollout(0).groups
    snapshot = trainer.lookahead_snapshot(groups, [[1.0] * len(groups)])

    def boom(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(trainer, "micro_batch_loss", boom)
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.update(groups)
    assert snapshot.tap.resolved and not snapshot.tap.wait()
    monkeypatch.undo()
    snapshot = trainer.lookahead_snapshot(groups, [[1.0] * len(groups)])
    monkeypatch.setattr(trainer.policy, "before_update", boom)
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.train_step()
    assert snapshot.tap.resolved and not snapshot.tap.wait()


def test_no_tap_where_the_update_takes_several_optimizer_steps_or_is_told_not_to(model_dir):
    for settings in (make_settings(mini_batches=2), make_settings(lookahead_from_update=False)):
        trainer = make_trainer(model_dir, settings)
        groups = trainer.sample_and_rollout(0).groups
        assert trainer.lookahead_snapshot(groups, [[1.0] * len(groups)]).tap is None


def test_off_policy_epochs_minibatches_and_kl(model_dir):
    settings = make_settings(ppo_epochs=2, mini_batches=2, grad_accum_steps=2, kl_coef=0.05, loss_aggregation="seq_mean")
    trainer = make_trainer(model_dir, settings)
    assert trainer.ref_model is not None
    record = trainer.train_step()
    assert math.isfinite(record["loss"]) and math.isfinite(record["kl"])
    assert 0.0 <= record["clip_frac"] <= 1.0 and record["entropy"] > 0
    assert all(not p.requires_grad for p in trainer.ref_model.parameters())


def test_overlong_penalty_and_generation_seeds():
    assert overlong_penalty(10, 16, 0, 1.0) == 0.0
    assert overlong_penalty(12, 16, 4, 1.0) == 0.0  # up to max_len - buffer: free
    assert overlong_penalty(14, 16, 4, 1.0) == pytest.approx(-0.5)
    assert overlong_penalty(16, 16, 4, 0.5) == pytest.approx(-0.5)
    seeds = {generation_seed(0, s, r, n) for s in range(3) for r in range(2) for n in (2, 4)}
    assert len(seeds) == 12 and all(0 <= s < 2**31 for s in seeds)


def test_q_per_cluster_plot_from_records(tmp_path):
    records = [{"kind": "train", "step": i, "reward_mean": 0.1 * i, "q/a": 0.5 + 0.1 * i, "q/b": 0.5 - 0.1 * i}
               for i in range(3)]
    names = {p.name for p in write_plots(records, tmp_path)}
    assert names == {"reward_vs_step.png", "q_per_cluster.png"}


def test_resumed_log_drops_steps_after_the_checkpoint(tmp_path):
    out = RunOutput(tmp_path, total_steps=4, progress=False)
    for step in range(4):
        out.log_step({"step": step, "reward_mean": 0.0, "rollouts_cumulative": step})
    out.bar.close()
    RunOutput(tmp_path, total_steps=4, start_step=2, progress=False).bar.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1]


def test_grpo_raises_a_learnable_reward(model_dir):
    # The toy reward (share of digit characters) is easy to climb: a sign or masking bug
    # in the loss would leave it flat or push it down.
    trainer = make_trainer(model_dir, make_settings(lr=3e-3), batch_size=4, rollouts=8)
    rewards = [trainer.train_step()["reward_mean"] for _ in range(25)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > 2 * first and last > first + 0.04, (first, last)
