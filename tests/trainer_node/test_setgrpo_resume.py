"""SetGRPO's calibration windows survive a checkpoint: the module's state_dict round-trips through
JSON (the checkpoint's trainer_state.json) and a resumed run gates as an uninterrupted one; the
trainer's checkpoint carries every update rule's state and refuses another rule's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.trainer_node.grpo_helpers import make_model_dir, make_settings, make_trainer
from tests.trainer_node.setgrpo_groups import make_input, noisy_groups
from trainer_node.grpo.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from trainer_node.grpo.update_seam import build_rule

FAST = {"name": "setgrpo", "min_calibration": 8, "alpha": 0.2, "calibration_fraction": 0.5, "beta": 0.3,
        "delta": 0.3, "thresholds": 4}


def _batches(steps: int):
    rng = np.random.default_rng(4)
    return [make_input(noisy_groups(rng, 8, flip=0.05), seed=step) for step in range(steps)]


def _same(out_a, out_b, metrics_a, metrics_b):
    assert torch.equal(out_a.keep, out_b.keep)
    assert torch.allclose(out_a.advantages, out_b.advantages, atol=1e-12)
    assert json.dumps(metrics_a, sort_keys=True) == json.dumps(metrics_b, sort_keys=True)


def test_a_resumed_module_keeps_its_windows_and_gates_as_an_uninterrupted_one():
    batches = _batches(16)
    straight = build_rule("coefficients", FAST)
    expected = [(straight.coefficients(b), straight.metrics()) for b in batches]
    assert any(m["setgrpo/calibrated"] == 1.0 and m["setgrpo/accepted_ratio"] > 0 for _, m in expected[10:])

    first = build_rule("coefficients", FAST)
    for b in batches[:10]:
        first.coefficients(b)
    state = json.loads(json.dumps(first.state_dict()))  # what trainer_state.json holds
    assert len(state["coverage_window"]) > 0 and len(state["risk_window"]) > 0
    resumed = build_rule("coefficients", FAST)
    resumed.load_state_dict(state)
    assert list(resumed.coverage_window) == list(first.coverage_window)
    assert len(resumed.risk_window) == len(first.risk_window)
    for b, (out, metrics) in zip(batches[10:], expected[10:]):
        _same(resumed.coefficients(b), out, resumed.metrics(), metrics)

    fresh = build_rule("coefficients", FAST)  # without the state: calibration starts over
    assert fresh.coefficients(batches[10]) is not None and fresh.metrics()["setgrpo/calibrated"] == 0.0


SETGRPO_SETTINGS = {"name": "setgrpo", "min_calibration": 1, "alpha": 0.5, "calibration_fraction": 0.5,
                    "beta": 0.5, "delta": 0.5, "thresholds": 2}


def test_the_trainer_checkpoint_carries_the_windows_and_refuses_another_rule(tmp_path):
    model_dir = make_model_dir(tmp_path / "m")
    settings = make_settings(coefficients=SETGRPO_SETTINGS)
    first = make_trainer(model_dir, settings=settings)
    for _ in range(3):
        first.train_step()
    rule = first.update_seams.coefficients
    assert rule.held_back_total > 0
    checkpoint = save_checkpoint(first, tmp_path / "ck")
    saved = json.loads((checkpoint / "trainer_state.json").read_text())["update_rules"]
    assert saved["coefficients"]["name"] == "setgrpo"

    second = make_trainer(model_dir, settings=settings)
    load_checkpoint(second, checkpoint)
    restored = second.update_seams.coefficients
    assert list(restored.coverage_window) == list(rule.coverage_window)
    assert restored.held_back_total == rule.held_back_total
    assert restored.state_dict() == json.loads(json.dumps(rule.state_dict()))
    assert _step(first) == _step(second)  # the next step gates alike (same windows, same rng)

    plain = make_trainer(model_dir)  # no coefficient module: the checkpoint's state is refused, nothing changed
    with pytest.raises(CheckpointError, match="update rules"):
        load_checkpoint(plain, checkpoint)
    assert plain.step_index == 0


def _step(trainer) -> str:
    record = trainer.train_step()
    return json.dumps({k: v for k, v in record.items() if k.startswith("setgrpo/") and not k.endswith("_s")},
                      sort_keys=True)
