"""The trainer's side of the rubric testbeds (issue 43): its pool is the same at every noise level and
carries nothing of the grader; the level reaches it only as the rollouts' grader; a bad grader
option in a run config is refused naming `data.grader.<option>`."""

from __future__ import annotations

import pytest

from rlvr_core.configuration import ConfigError
from rlvr_core.tasks.example import Example
from rlvr_core.verifiers.draws import DrawKey
from trainer_node.config import DataConfig, parse_config
from trainer_node.training import load_source, source_grader, split_source

FAMILY = ("rubric_low", "rubric", "rubric_high")


def _pool(name: str) -> tuple[Example, ...]:
    source = load_source(DataConfig(testbed=name))
    pool, _ = split_source(tuple(source.data.source), 50, int(source.testbed.seed))
    return pool


def test_the_pool_is_the_same_at_every_noise_level_and_names_no_grader():
    pools = [_pool(name) for name in FAMILY]
    assert [e.to_json() for e in pools[0]] == [e.to_json() for e in pools[1]] == [e.to_json() for e in pools[2]]
    for example in pools[0]:
        assert example.verifier == "rubric"  # the row names its exact grader; the noise is not the row's
        assert "grader" not in str(example.to_json())


def test_the_level_reaches_the_trainer_only_as_the_rollouts_grader():
    row = _pool("rubric")[0]
    graders = {name: source_grader("testbed", load_source(DataConfig(testbed=name)).testbed) for name in FAMILY}
    wrong = "#0~"  # meets some items at most
    keys = [DrawKey.of(0, row.id, k) for k in range(300)]
    spread = {name: len({grade(wrong, row, key, 2) for key in keys}) for name, grade in graders.items()}
    assert all(count > 1 for count in spread.values())  # noisy draws at every level
    assert source_grader("exact", load_source(DataConfig(testbed="rubric")).testbed) is None  # each row's exact one


@pytest.mark.parametrize("grader,field", [
    ({"name": "rubric_grader", "misjudge_rate": 0.5}, "data.grader.misjudge_rate"),
    ({"name": "rubric_grader", "check_frac": 0.5}, "data.grader.check_frac"),
])
def test_a_bad_grader_option_in_a_run_config_names_the_field(grader, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_config({"data": {"testbed": "rubric", "grader": grader}})
