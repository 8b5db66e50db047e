"""Issue 42: one seed gives one simulate run, whatever the machine's load. Releases land a fixed number
of steps after their query (L2RR's fixed_staleness, the default) and the simulated owner draws each
release's subsample and noise from the run's seed and the request (simulated_owner.noise = seeded), so
nothing a run reports depends on how fast the owner answered."""

from __future__ import annotations

import json
import multiprocessing
import os

from tests.trainer_node.grpo_helpers import make_model_dir
from trainer_node.cli import main

TIMING_PREFIXES = ("time/", "cpu/")
TIMING_SUFFIXES = ("_s", "_seconds")  # wall_seconds, step_seconds, ...: how long, never what


def _without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIXES) and not k.endswith(TIMING_SUFFIXES)}


def _burn(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _config(tmp_path, run_dir):
    config = tmp_path / "sim.toml"
    config.write_text(f"""
[model]
path = "{make_model_dir(tmp_path)}"
[data]
testbed = "small"
eval_size = 0
grader = {{ name = "noisy_flip", flip_rate = 0.45 }}  # a random tiny model scores 0: noisy rewards give groups
[policy]
name = "l2rr"
batch_size = 4
rollouts_per_prompt = 4
max_staleness = 2
[rollout]
max_new_tokens = 4
[run]
steps = 8
out_dir = "{run_dir}"
eval_every = 4
""")
    return config


def _run(tmp_path, name: str, load: int) -> tuple[dict, list[dict]]:
    run_dir = tmp_path / name / "run"
    config = _config(tmp_path / name, run_dir)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    burners = [context.Process(target=_burn, args=(stop,), daemon=True) for _ in range(load)]
    for burner in burners:
        burner.start()
    try:
        assert main(["simulate", "--config", str(config), "--no-progress", "--epsilon", "4"]) == 0
    finally:
        stop.set()
        for burner in burners:
            burner.join(timeout=10)
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return _without_timing(summary), [_without_timing(r) for r in records]


def test_one_seed_gives_the_same_run_idle_and_under_cpu_load(tmp_path):
    (tmp_path / "idle").mkdir()
    (tmp_path / "loaded").mkdir()
    idle_summary, idle_records = _run(tmp_path, "idle", load=0)
    loaded_summary, loaded_records = _run(tmp_path, "loaded", load=max(2, os.cpu_count() or 2))
    assert idle_summary["feedback_queries"] >= 2 and idle_summary["epsilon_spent"] > 0  # DP releases were read
    assert any(value for record in idle_records for key, value in record.items() if key.startswith("hypergrad/"))
    assert _differences([loaded_summary], [idle_summary]) == []
    assert _differences(loaded_records, idle_records) == []


def _differences(runs: list[dict], references: list[dict]) -> list[tuple]:
    """(record, key, this run's value, the reference's value) for every figure that differs."""
    assert len(runs) == len(references)
    return [(index, key, run.get(key), reference.get(key))
            for index, (run, reference) in enumerate(zip(runs, references))
            for key in sorted(set(run) | set(reference)) if run.get(key) != reference.get(key)]
