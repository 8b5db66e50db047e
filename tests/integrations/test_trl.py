"""TRL's GRPOTrainer with the L2RR sampler and target feedback: the sampler's layout on simulated ranks,
and a few real GRPOTrainer steps on CPU against a real owner process (simulate with [engine] name = "trl")."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.trainer_node.test_policy_fakes import make_pool
from trainer_node.integrations.core import GlobalIndexStream, cluster_ids

pytest.importorskip("trl")


def sampler_for(pool, q, G=2, repeat=2, rounds=5, prompts=3):
    from trainer_node.integrations.trl import QRepeatSampler

    cluster_of, names = cluster_ids(pool)
    return QRepeatSampler(GlobalIndexStream(cluster_of, len(names), prompts, seed=7), q, G, repeat, rounds)


def test_the_sampler_keeps_repeat_samplers_layout_and_q_moves_later_rounds():
    pool = make_pool(per_cluster=5)
    sampler = sampler_for(pool, np.full(4, 0.25))
    stream = iter(sampler)
    first = [next(stream) for _ in range(3 * 2 * 2)]  # one round: 3 prompts x G=2, repeated twice
    chunk = sampler.drawn[0]
    assert first == [i for i in chunk for _ in range(2)] * 2
    sampler.q = np.array([1.0, 0.0, 0.0, 0.0])  # rank 0's update, broadcast: the next round follows it
    second = [next(stream) for _ in range(12)]
    assert {pool.clusters[i] for i in second} == {"algebra"}
    assert len(sampler) == 5 * 3 * 2 * 2


def test_two_simulated_ranks_share_one_global_stream_and_split_it_as_accelerate_does():
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    pool = make_pool(per_cluster=5)
    q = np.array([0.4, 0.3, 0.2, 0.1])
    local = 3  # per-device batch: 6 items per round over 2 ranks
    shards = [list(BatchSamplerShard(BatchSampler(sampler_for(pool, q, repeat=1), local, drop_last=False),
                                     num_processes=2, process_index=rank)) for rank in (0, 1)]
    reference = sampler_for(pool, q, repeat=1)
    items = list(reference)
    for k, (mine, theirs) in enumerate(zip(*shards)):
        assert mine + theirs == items[2 * local * k: 2 * local * (k + 1)]  # rank r holds [r*L, (r+1)*L)


def test_a_few_real_trl_steps_against_a_real_owner_move_q_and_charge_epsilon(tmp_path, capsys):
    from tests.lab.test_simulate import _tiny_sim_config
    from trainer_node.cli import main

    run_dir = tmp_path / "run"
    config = _tiny_sim_config(
        tmp_path, run_dir, "l2rr", steps=4,
        policy_fields='estimator = "release_difference"\nmax_staleness = 0',
        extra='[engine]\nname = "trl"\n',
    )
    # Rewards with variance from a random tiny model: a coin-flip grader (rlvr_core/verifiers/noisy.py).
    text = config.read_text().replace('eval_size = 0', 'eval_size = 0\ngrader = { name = "noisy_flip", '
                                      'flip_rate = 0.45 }')
    config.write_text(text)
    assert main(["simulate", "--config", str(config), "--no-progress", "--epsilon", "8"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["rollouts"] == 4 * 4 * 2
    assert 0.0 <= summary["target_accuracy_before"] <= 1.0 and 0.0 <= summary["target_accuracy_after"] <= 1.0
    assert summary["epsilon_spent"] > 0 and summary["feedback_queries"] >= 3
    assert summary["feedback_candidates"] == summary["feedback_queries"]  # one checkpoint per release
    train = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if r["kind"] == "train"]
    q_last = [v for k, v in train[-1].items() if k.startswith("q/")]
    assert len(q_last) == 4 and max(abs(v - 0.25) for v in q_last) > 1e-6  # q moved
    assert train[-1]["epsilon_spent"] > 0
    out = capsys.readouterr().out
    assert "target test accuracy" in out and "epsilon spent" in out and "rollouts spent" in out
    assert "engine" in json.loads((run_dir / "resolved_config.json").read_text())


def test_the_readme_trl_config_loads():
    from lab.simulate import SimulateOptions, resolve_config

    config = resolve_config(SimulateOptions(config="lab/configs/simulate_trl.toml"))
    assert config.engine.name == "trl" and config.policy.estimator == "release_difference"
