"""SetGRPO end to end: `trainer-node simulate` on CPU with the noisy testbed, selected by config
(grpo.coefficients), its diagnostics and timings in metrics.jsonl; and the LM-head geometry
equals autograd's gradients."""

from __future__ import annotations

import json

import torch

from tests.lab.test_simulate import _tiny_sim_config
from tests.trainer_node.grpo_helpers import make_model_dir, make_trainer
from trainer_node.cli import main
from trainer_node.grpo.geometry import head_features

SETGRPO = ('[grpo]\ncoefficients = { name = "setgrpo", min_calibration = 2, alpha = 0.4, beta = 0.5, '
           'delta = 0.5, thresholds = 3, calibration_fraction = 0.5 }')


def test_simulate_runs_setgrpo_on_the_noisy_testbed(tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = _tiny_sim_config(tmp_path, run_dir, "uniform", extra=SETGRPO, steps=3)
    assert main(["simulate", "--config", str(config), "--testbed", "noisy", "--no-dp", "--no-progress"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["testbed"] == "noisy" and summary["update_rules"] == {"coefficients": "setgrpo"}
    train = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert len(train) == 3
    for record in train:
        assert record["setgrpo/heldback_groups"] == 2.0            # of 4 groups: they still count as rollouts
        assert record["rollouts_step"] == 8
        for key in ("setgrpo/jacobian_s", "setgrpo/recovery_s", "setgrpo/accepted_ratio",
                    "setgrpo/recovery_mean", "setgrpo/coef_norm", "setgrpo/coverage"):
            assert key in record
    resolved = json.loads((run_dir / "resolved_config.json").read_text())
    assert resolved["grpo"]["coefficients"]["name"] == "setgrpo"
    assert "coefficients setgrpo" in capsys.readouterr().out


def test_head_features_are_the_lm_head_gradients_of_each_response(tmp_path):
    trainer = make_trainer(make_model_dir(tmp_path), batch_size=2, rollouts=2)
    groups = trainer.sample_and_rollout(0).groups
    batch = trainer.build_batch(groups)
    features = head_features(trainer.model, batch, temperature=1.0)
    head = trainer.model.get_output_embeddings().weight.detach().clone().requires_grad_(True)
    for row in range(batch.size):
        one = batch.rows(slice(row, row + 1))
        # the head's own role only (the tiny policy ties it to the input embedding)
        with torch.no_grad():
            out = trainer.model(input_ids=one.input_ids, attention_mask=one.attention_mask, output_hidden_states=True)
        logits = torch.nn.functional.linear(out.hidden_states[-1], head)[:, :-1]
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, one.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        mask = one.completion_mask[:, 1:]
        mean_logp = (logp * mask).sum() / mask.sum().clamp(min=1)
        (grad,) = torch.autograd.grad(mean_logp, head)
        assert torch.allclose(features[row].float(), grad.flatten(), atol=1e-5)
