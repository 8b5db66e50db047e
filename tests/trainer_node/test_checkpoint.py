import json

import pytest
import torch

from tests.trainer_node.grpo_helpers import make_model_dir, make_trainer, parameters
from trainer_node.grpo.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("ckpt"))


def _summary(record):
    return (record["step"], record["loss"], record["reward_mean"], record["rollouts_cumulative"])


def test_k_steps_plus_resume_equals_n_straight_steps(model_dir, tmp_path):
    straight = make_trainer(model_dir)
    straight_records = [_summary(straight.train_step()) for _ in range(3)]

    first = make_trainer(model_dir)
    resumed_records = [_summary(first.train_step())]
    checkpoint = save_checkpoint(first, tmp_path / "run" / "checkpoints" / "step_000001")
    torch.manual_seed(999)  # scramble global RNG state: resume must restore it

    second = make_trainer(model_dir)
    load_checkpoint(second, latest_checkpoint(tmp_path / "run"))
    assert second.step_index == 1 and second.rollouts_cumulative == 16
    resumed_records += [_summary(second.train_step()) for _ in range(2)]

    for a, b in zip(straight_records, resumed_records):
        assert a[0] == b[0] and a[3] == b[3]
        assert a[1] == pytest.approx(b[1], abs=1e-6) and a[2] == pytest.approx(b[2], abs=1e-6)
    final_a, final_b = parameters(straight), parameters(second)
    assert max(float((final_a[k] - final_b[k]).abs().max()) for k in final_a) < 1e-6
    # No pickle anywhere: only safetensors and JSON.
    suffixes = {p.suffix for p in checkpoint.rglob("*") if p.is_file()}
    assert suffixes <= {".safetensors", ".json"}, suffixes


def test_bad_checkpoints_are_rejected_without_changes(model_dir, tmp_path):
    trainer = make_trainer(model_dir)
    checkpoint = save_checkpoint(trainer, tmp_path / "ck")
    before = parameters(trainer)

    with pytest.raises(CheckpointError, match="trainer_state.json is missing"):
        load_checkpoint(trainer, tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="neither a checkpoint"):
        latest_checkpoint(tmp_path / "empty")

    state = json.loads((checkpoint / "trainer_state.json").read_text())
    (checkpoint / "trainer_state.json").write_text(json.dumps({**state, "policy_name": "greso"}))
    with pytest.raises(CheckpointError, match="data policy 'greso'"):
        load_checkpoint(trainer, checkpoint)
    (checkpoint / "trainer_state.json").write_text(json.dumps({**state, "format_version": 99}))
    with pytest.raises(CheckpointError, match="format_version"):
        load_checkpoint(trainer, checkpoint)
    (checkpoint / "optimizer.safetensors").unlink()
    with pytest.raises(CheckpointError, match="optimizer.safetensors is missing"):
        load_checkpoint(trainer, checkpoint)
    assert all(torch.equal(before[k], v) for k, v in parameters(trainer).items())
