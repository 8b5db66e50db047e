"""Lookahead candidates along the clusters' running directions (grpo/cluster_directions.py,
grpo.lookahead_directions = "cluster_mean"): the running average, the update it leaves unchanged,
and candidates built now and from a snapshot."""

from __future__ import annotations

import pytest
import torch

from tests.trainer_node.grpo_helpers import make_model_dir, make_settings, make_trainer
from trainer_node.grpo.cluster_directions import ClusterDirections


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("directions"))


def _t(*values: float) -> list[torch.Tensor]:
    return [torch.tensor(list(values), dtype=torch.float64)]


def test_a_direction_is_the_count_weighted_average_of_whole_batch_gradients():
    directions = ClusterDirections(beta=0.5)
    # step 1: a has 1 of 4 groups with gradient g (whole-batch normaliser): as a batch of a alone, 4 g
    directions.record(["w"], {"a": _t(1.0, 0.0), "b": _t(0.0, 3.0)}, {"a": 1, "b": 3}, batch_groups=4)
    assert torch.allclose(directions.mixture({"a": 1.0})[0], torch.tensor([4.0, 0.0], dtype=torch.float64))
    assert torch.allclose(directions.mixture({"b": 1.0})[0], torch.tensor([0.0, 4.0], dtype=torch.float64))
    # step 2: only a, 2 of 2 groups: (0.5 * 4 * [1, 0] + 2 * [0, 1]) / (0.5 * 1 + 2)
    directions.record(["w"], {"a": _t(0.0, 1.0)}, {"a": 2}, batch_groups=2)
    expected = (0.5 * torch.tensor([4.0, 0.0]) + torch.tensor([0.0, 2.0])) / 2.5
    assert torch.allclose(directions.mixture({"a": 1.0})[0], expected.double())
    assert torch.allclose(directions.mixture({"b": 1.0})[0], torch.tensor([0.0, 4.0], dtype=torch.float64)), \
        "an absent cluster keeps its direction"
    mixed = directions.mixture({"a": 0.25, "b": 0.75})[0]
    assert torch.allclose(mixed, 0.25 * expected.double() + 0.75 * torch.tensor([0.0, 4.0], dtype=torch.float64))
    assert directions.clusters() == ["a", "b"]


def test_a_copy_is_independent_and_unknown_clusters_are_refused():
    directions = ClusterDirections(beta=0.9)
    directions.record(["w"], {"a": _t(1.0)}, {"a": 1}, batch_groups=1)
    twin = directions.copy()
    directions.record(["w"], {"a": _t(-5.0)}, {"a": 1}, batch_groups=1)
    assert twin.mixture({"a": 1.0})[0].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no direction for any of the clusters"):
        twin.mixture({"z": 1.0})
    with pytest.raises(ValueError, match="beta"):
        ClusterDirections(beta=1.0)


def test_the_split_backward_trains_exactly_as_the_plain_one(model_dir):
    """cluster_mean changes what candidates step along, never the update itself."""
    plain = make_trainer(model_dir, settings=make_settings(), batch_size=6)
    split = make_trainer(model_dir, settings=make_settings(lookahead_directions="cluster_mean"), batch_size=6)
    for trainer in (plain, split):
        for _ in range(2):
            trainer.train_step()
    for (name, a), (_, b) in zip(plain.model.named_parameters(), split.model.named_parameters(), strict=True):
        # The two backwards sum in another order. Adam divides by sqrt(v), so on the few entries
        # whose gradient is ~0 it scales that rounding up (to ~1e-5 on an AVX-512 CPU, 1-3 of 2048
        # entries); a real difference in the update would move entries by ~lr (1e-2) everywhere.
        diff = (a - b).abs()
        assert diff.max() < 1e-4, name
        assert int((diff > 1e-6).sum()) <= max(3, a.numel() // 200), name
    assert split.direction_clusters() == ["even", "odd"] and plain.direction_clusters() == []


def test_direction_candidates_step_along_each_cluster_and_leave_the_live_model(model_dir):
    trainer = make_trainer(model_dir, settings=make_settings(lookahead_directions="cluster_mean",
                                                             lookahead="adam_preconditioned"), batch_size=6)
    trainer.train_step()
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    even, odd = trainer.direction_state_dicts([{"even": 1.0}, {"odd": 1.0}])
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    moved = [k for k in even if not torch.equal(even[k], before[k])]
    assert moved and any(not torch.equal(even[k], odd[k]) for k in moved)
    snapshot = trainer.lookahead_snapshot()
    trainer.train_step()  # training goes on: the snapshot's candidates are those of its step
    again = trainer.directions_from_snapshot(snapshot, [{"even": 1.0}, {"odd": 1.0}])
    for built, rebuilt in ((even, again[0]), (odd, again[1])):
        assert all(torch.allclose(built[k], rebuilt[k], atol=1e-6) for k in built)


def test_direction_candidates_need_cluster_mean(model_dir):
    trainer = make_trainer(model_dir, batch_size=4)
    with pytest.raises(RuntimeError, match="lookahead_directions = 'cluster_mean'"):
        trainer.direction_state_dicts([{"even": 1.0}])
