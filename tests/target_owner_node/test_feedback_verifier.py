"""The owner's per-split verifier (issue 19): a noisy grader may score the feedback split, the
test split is always exact; a noisy verifier's draws on the owner are keyed by (request seed,
row key, sample index), so a row's score never depends on which other rows are scored."""

from __future__ import annotations

import numpy as np
import pytest

from rlvr_core.scoring import Decoding, score_rows
from rlvr_core.tasks.example import Example
from rlvr_core.verifiers import get_verifier
from target_owner_node.config import ConfigError, load_config
from target_owner_node.node import worker_spec
from tests.rlvr_core.test_scoring import TEMPLATE, ScriptedEngine
from tests.target_owner_node.test_config import MINIMAL, _write


def test_feedback_verifier_reaches_the_worker_and_bad_ones_name_the_field(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL.replace("[data]\n", "[data]\nfeedback_verifier = \"noisy_flip\"\n")))
    assert config.data.feedback_verifier == "noisy_flip" and worker_spec(config).feedback_verifier == "noisy_flip"
    assert worker_spec(load_config(_write(tmp_path, MINIMAL))).feedback_verifier == ""
    with pytest.raises(ConfigError, match=r"data\.verifier.*noisy grader.*data\.feedback_verifier"):
        load_config(_write(tmp_path, MINIMAL.replace("[data]\n", "[data]\nverifier = \"noisy_flip\"\n")))
    with pytest.raises(ConfigError, match=r"data\.feedback_verifier.*registered verifier"):
        load_config(_write(tmp_path, MINIMAL.replace("[data]\n", "[data]\nfeedback_verifier = \"nosy\"\n")))


def _rows(count: int) -> list[Example]:
    return [Example(id=f"r{i}", prompt="p", answer="7") for i in range(count)]  # exact_match rows


NOISY = get_verifier("noisy_flip")  # flip_rate 0.2 on top of each row's own verifier


def test_noisy_scores_on_the_owner_are_keyed_by_seed_row_and_sample():
    decoding = Decoding(max_new_tokens=2, samples_per_prompt=8, temperature=1.0, seed=3)
    engine = ScriptedEngine(["7"] * 8)
    rows = _rows(40)
    keys = list(range(100, 140))
    scores = score_rows(engine, rows, TEMPLATE, decoding, keys, verifier=NOISY)
    assert np.array_equal(scores, score_rows(engine, rows, TEMPLATE, decoding, keys, verifier=NOISY))   # replays match
    alone = score_rows(engine, rows[5:6], TEMPLATE, decoding, keys[5:6], verifier=NOISY)
    assert alone[0] == scores[5]                                   # independent of the other rows drawn
    assert len(set(scores.tolist())) > 1                           # the samples' draws differ
    other_seed = score_rows(engine, rows, TEMPLATE, Decoding(2, 8, 1.0, 4), keys, verifier=NOISY)
    assert not np.array_equal(scores, other_seed)
    assert scores.mean() == pytest.approx(0.8, abs=0.06)           # flip_rate 0.2 of a right answer
    assert np.array_equal(score_rows(engine, rows, TEMPLATE, decoding, keys), np.ones(40))  # exact without it
