"""release_difference through this project's own run loop (simulate, a real owner process, synchronous
feedback, so the count is exact): each query uploads and releases the live model alone."""

from __future__ import annotations

import json

import pytest

from tests.lab.test_simulate import _tiny_sim_config
from trainer_node.cli import main


@pytest.mark.slow  # ~16 s alone, 30-45 s under load; the send_query unit tests cover the seam
def test_simulate_learns_q_from_one_checkpoint_per_query(tmp_path):
    run_dir = tmp_path / "run"
    config = _tiny_sim_config(tmp_path, run_dir, "l2rr", steps=4,
                              policy_fields='estimator = "release_difference"\nmax_staleness = 0')
    assert main(["simulate", "--config", str(config), "--no-progress", "--epsilon", "8"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["feedback_queries"] >= 2 and summary["epsilon_spent"] > 0
    assert summary["feedback_candidates"] == summary["feedback_queries"]  # the base alone, nothing built
    assert summary["time/candidates_s"] == 0.0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "train"]
    assert len(steps) == 4 and steps[-1]["feedback_failures"] == 0
