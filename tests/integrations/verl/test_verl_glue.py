"""The verl adapter's glue that needs no verl: it imports, reads verl's row ids and checkpoint layout,
and refuses what it cannot use. Runs in the project's own environment too (verl absent)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from trainer_node.integrations import verl as adapter


class FakeDataset:
    """verl's RLHFDataset as the adapter reads it: len() and `.dataframe` rows."""

    def __init__(self, rows):
        self.dataframe = rows

    def __len__(self):
        return len(self.dataframe)


def rows(indices, sources=("a", "b")):
    return [{"data_source": sources[i % len(sources)], "prompt": [{"role": "user", "content": f"q{i}"}],
             "reward_model": {"ground_truth": str(i)}, "extra_info": {"index": index, "cluster": f"c{i % 3}"}}
            for i, index in enumerate(indices)]


def test_the_module_imports_without_verl_and_names_its_base():
    if importlib.util.find_spec("verl") is None:
        assert adapter.SAMPLER_BASE.__module__ == "torch.utils.data.sampler" and not adapter.CURRICULUM_HOOK
    assert adapter.VERL.lookahead_candidates is False and adapter.VERL.any_policy is False


def test_the_pool_follows_the_dataset_order_and_reads_rows_back_by_index():
    pool, position_of = adapter.pool_from_dataset(FakeDataset(rows([7, 3, 9])), "extra_info.cluster")
    assert [e.id for e in pool.examples] == ["7", "3", "9"] and pool.clusters == ("c0", "c1", "c2")
    assert position_of == {7: 0, 3: 1, 9: 2}
    assert adapter.pool_from_dataset(FakeDataset(rows([0, 1])), "data_source")[0].clusters == ("a", "b")
    assert adapter.pool_from_dataset(FakeDataset(rows([0])), "nope")[0].clusters == ("all",)


@pytest.mark.parametrize(("indices", "message"), [
    ([1, 1], "extra_info.index 1 repeats row 0"),
    ([1, "x"], "extra_info.index must be an integer"),
    ([], "holds no rows"),
])
def test_rows_without_unique_integer_ids_are_refused(indices, message):
    with pytest.raises((TypeError, ValueError), match=message):
        adapter.pool_from_dataset(FakeDataset(rows(indices)), "data_source")


def test_options_are_typed_and_a_typo_names_the_key():
    options = adapter.read_options({"l2rr": {"seed": 3, "reward_key": "acc"}})
    assert options.seed == 3 and options.policy == {"name": "l2rr", "estimator": "release_difference"}
    assert adapter.read_options({}).checkpoint_dir is None
    with pytest.raises(ValueError, match="did you mean 'checkpoint_dir'"):
        adapter.read_options({"l2rr": {"checkpoint_dr": "/x"}})
    with pytest.raises(TypeError, match="data.l2rr must be a mapping"):
        adapter.read_options({"l2rr": [1]})


def test_feedback_needs_where_checkpoints_are_and_how_long_the_run_is(tmp_path):
    options = adapter.read_options({"l2rr": {"feedback": {"target": "h:1"}}})
    with pytest.raises(ValueError, match="data.l2rr.checkpoint_dir and data.l2rr.total_steps"):
        adapter.connect_feedback(options, 8, client=SimpleNamespace())
    options = adapter.read_options({"l2rr": {"feedback": {"target": "nope"}, "checkpoint_dir": str(tmp_path),
                                             "total_steps": 5}})
    with pytest.raises(ValueError, match="data.l2rr.feedback"):
        adapter.connect_feedback(options, 8, client=SimpleNamespace())


def test_latest_hf_checkpoint_names_the_setting_to_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="trainer.save_freq"):
        adapter.latest_hf_checkpoint(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("oops")
    with pytest.raises(FileNotFoundError, match="no step number"):
        adapter.latest_hf_checkpoint(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("20\n")
    folder = tmp_path / "global_step_20" / "actor" / "huggingface"
    folder.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="hf_model.*save_contents"):
        adapter.latest_hf_checkpoint(tmp_path)
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert adapter.latest_hf_checkpoint(tmp_path) == folder
