"""tools/bench_owner_scoring.py --release (issue 40, "Cost"): which releases it compares and the
decodings it times them with, as the trainer asks for them (not timed here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_tool():
    spec = importlib.util.spec_from_file_location("bench_owner_scoring", ROOT / "tools" / "bench_owner_scoring.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RESOLVED = {"rollout": {"max_new_tokens": 8}, "run": {"seed": 3}, "feedback": None,
            "policy": {"release": {"kind": "difference", "metric": "answer_probability", "samples_per_prompt": 4,
                                   "temperature": 1.0, "clip": None, "clip_quantile": 0.9,
                                   "calibration_prompts": 64}}}


def test_releases_are_parsed_and_difference_alone_means_every_metric():
    from rlvr_core.differences import difference_metric_names

    tool = load_tool()
    assert tool.parse_releases("accuracy,difference:importance") == [("accuracy", ""), ("difference", "importance")]
    every = tool.parse_releases("accuracy+base,difference")
    assert every == [("accuracy+base", "")] + [("difference", name) for name in difference_metric_names()]
    for bad in ("accuracy:importance", "difference:nope", "exact", ""):
        with pytest.raises(ValueError, match="release"):
            tool.parse_releases(bad)


def test_decodings_are_the_trainers():
    tool = load_tool()
    accuracy = tool.accuracy_decoding(RESOLVED)  # no [feedback]: FeedbackSettings' greedy single sample
    assert accuracy == {"max_new_tokens": 8, "samples_per_prompt": 1, "temperature": 0.0, "seed": 3}
    assert tool.accuracy_decoding({**RESOLVED, "feedback": {"samples_per_prompt": 2, "temperature": 0.7}}, 16) == \
        {"max_new_tokens": 16, "samples_per_prompt": 2, "temperature": 0.7, "seed": 3}
    # a sampling metric: the release's samples and temperature; the reference answer: one completion
    assert tool.difference_decoding(RESOLVED, "importance", accuracy) == {**accuracy, "samples_per_prompt": 4,
                                                                          "temperature": 1.0}
    assert tool.difference_decoding(RESOLVED, "answer_probability", accuracy) == {**accuracy, "temperature": 1.0}
    assert tool.difference_decoding({"policy": {}}, "log_ratio", accuracy)["samples_per_prompt"] == 4  # defaults


def test_a_folder_that_is_not_a_run_is_named(tmp_path, capsys):
    tool = load_tool()
    with pytest.raises(SystemExit):
        tool.main([str(tmp_path), "--release", "accuracy,difference"])
    assert "RUN_DIR must be a finished simulate run" in capsys.readouterr().err
