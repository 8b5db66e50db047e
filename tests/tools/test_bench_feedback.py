"""tools/bench_feedback.py (issue 14's one benchmark command): it measures goals in a subprocess
per tree and prints them side by side with today's (smoke test on tiny sizes; not timed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_tool():
    spec = importlib.util.spec_from_file_location("bench_feedback", ROOT / "tools" / "bench_feedback.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_report_puts_every_goal_beside_today():
    tool = load_tool()
    run = {"loop_s": 105.0, "steps": 60, "phases_s": {"candidates": 1.0, "upload": 2.0, "owner_wait": 2.0},
           "queries": 10, "uploaded_bytes": 10 * 2**20, "checkpoint_bytes": 2**21}
    now = {
        1: {"feedback": run, "ablation": {**run, "loop_s": 100.0}, "release_difference": {**run, "loop_s": 99.0},
            "rounds": [{"feedback": 105.0, "ablation": 100.0, "release_difference": 99.0},
                       {"feedback": 130.0, "ablation": 100.0, "release_difference": 101.0},
                       {"feedback": 120.0, "ablation": 100.0, "release_difference": 90.0}]},
        2: {"full_bytes": 3 * 2**30, "adapter_bytes": 9 * 2**20, "adapter_validated": True,
            "lora_run": {"steps": 40, "queries": 4, "candidates": 16, "query_bytes": 4 * 2**20,
                         "checkpoint_bytes": 2**23}},
        3: {"upload_mib_s": 60.0, "copy_mib_s": 300.0, "size_mb": 100,
            "k_of_t": {"k": 2, "T": 20, "bytes_new": 10, "bytes_full": 100, "bytes_of_changed_tensors": 9}},
        4: {"pool": 10_000_000, "l2rr": {"ms_per_round": 2.0, "policy_rss_mb": 300.0},
            "greso": {"ms_per_round": 1.5, "policy_rss_mb": 200.0}},
        5: {"first_start_s": 9.0, "cached_start_s": 1.5, "cached_stop_s": 0.5, "drain_delay_s": 0.0},
    }
    today = {1: {"feedback": {**run, "loop_s": 200.0, "phases_s": {}}, "ablation": {**run, "loop_s": 100.0}},
             2: {"full_bytes": 3 * 2**30, "adapter_bytes": 9 * 2**20, "adapter_validated": None},
             4: {"error": "boom"}}
    lines = tool.report({"now": now, "today": today})
    text = "\n".join(lines)
    assert lines[0].split() == ["figure", "this", "tree", "today", "goal"]
    # lookahead: the median, and the geometric mean of the rounds' ratios with its paired t-interval
    assert ("1.20x median of 3; geometric mean 1.18x [0.90, 1.54] (105/100, 130/100, 120/100 s; 60 steps, "
            "10 queries)") in text
    assert "0.99x median of 3; geometric mean 0.97x" in text and "(99/100, 101/100, 90/100 s" in text
    assert "2.00x median of 1 (200/100 s" in text and "not in this tree" in text  # today: one round, no estimator
    assert "4.8% of the loop" in text and "not recorded" in text
    assert "0.50 checkpoints (1.0 MiB, 10 queries)" in text
    assert "2.1% (7 x 9.0 MiB vs 3.00 GiB)" in text and "20% (60 / 300 MiB/s" in text
    assert "10.0% of the bytes for k/T = 2/20 tensors holding 9.0%" in text and "error: boom" in text
    assert "1.50 s (first 9.00 s)" in text and "700% (7 full checkpoints: no adapters)" in text
    assert "12.5% (1024 KiB = 4.0 adapters/query, 4 queries; base once: 8.0 MiB)" in text
    assert "not run (no LoRA training, or --lora-steps 0)" in text


def test_it_measures_the_sampler_the_bytes_and_the_owner_start(tmp_path):
    out = tmp_path / "figures.json"
    command = [sys.executable, str(ROOT / "tools" / "bench_feedback.py"), "--goals", "2,4,5", "--pool", "3000",
               "--rounds", "1", "--lora-steps", "0", "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    figures = json.loads(out.read_text())["now"]
    assert figures["2"]["full_bytes"] > 3 * 10**9 and figures["2"]["adapter_validated"] is True
    assert 0 < figures["2"]["adapter_bytes"] < figures["2"]["full_bytes"] / 100
    assert figures["2"]["adapter_source"] == "get_peft_model on the meta model"  # the real PEFT shapes
    assert figures["2"]["adapter_parameters"] == 4_358_144  # r = 16 on q/k/v/o_proj of Qwen2-1.5B
    assert figures["4"]["pool"] == 3000 and figures["4"]["l2rr"]["ms_per_round"] > 0
    assert figures["4"]["greso"]["ms_per_round"] > 0
    assert 0 < figures["5"]["cached_start_s"] and figures["5"]["first_start_s"] > 0
    assert "4 l2rr ms/round" in result.stdout and "5 owner start, calibration cached" in result.stdout


def test_goal1_runs_the_arms_asked_for_beside_the_ablation():
    tool = load_tool()
    assert tool.chosen_arms("all") is None
    assert tool.chosen_arms("feedback, release_difference") == {"feedback", "release_difference"}
    try:
        tool.chosen_arms("feedback,lookahed")
    except SystemExit as error:
        assert "--arms: unknown arm 'lookahed'" in str(error) and "release_difference" in str(error)
    else:
        raise AssertionError("an unknown arm was accepted")
    data = {"only": ["feedback"], "ablation": {"loop_s": 1.0}}
    assert tool._loop_ratio(data, "owner_nice0") == "not run (--arms)"


def test_every_goal1_arm_runs_on_this_tree():
    """Each arm names a file and a name the tree must have (the "today" tree lacks the later
    arms); in this tree every one is there, so goal 1 measures all of them side by side."""
    tool = load_tool()
    labels = [label for label, *_ in tool.ARMS]
    assert labels[:2] == ["ablation", "feedback"] and "lookahead_recompute" in labels
    for _label, needs, _lines in tool.ARMS:
        assert needs is None or needs[1] in (ROOT / needs[0]).read_text()


def test_every_goal1_arm_is_a_valid_simulate_config(tmp_path):
    """Each arm's lines land in their sections of simulate's defaults, and the result validates
    with the value the arm sets (a typo would otherwise cost a whole benchmark run)."""
    import tomllib

    from trainer_node.config import TrainConfig

    tool = load_tool()
    defaults = (ROOT / "lab" / "configs" / "simulate_default.toml").read_text()
    for label, _needs, lines in tool.ARMS:
        table = tomllib.loads(tool.arm_config(defaults, lines))
        config = TrainConfig.model_validate(table)
        for section, text in lines.items():
            for line in text.splitlines():
                key, value = (part.strip() for part in line.split("=", 1))
                expected, got = tomllib.loads(f"v = {value}")["v"], getattr(getattr(config, section), key)
                if isinstance(expected, dict):  # an inline table: the typed options it set
                    got = {name: getattr(got, name) for name in expected}
                assert got == expected, label


def test_goal1_splits_the_training_threads_time_and_holds_q_for_feedbacks_own_cost():
    """The q_held arm (eta_q = 0) trains the ablation's batches; each arm's training thread is split
    into CPU and the time it waited, beside the rollouts it trained."""
    tool = load_tool()
    assert {label: lines for label, _needs, lines in tool.ARMS}["q_held"] == {"policy": "eta_q = 0.0"}
    held_rd = {label: lines for label, _needs, lines in tool.ARMS}["release_difference_q_held"]["policy"]
    assert held_rd.splitlines() == ['estimator = "release_difference"', "eta_q = 0.0"]
    base = {"loop_s": 10.0, "cpu_s": 9.9, "train_rollouts": 1677, "steps": 60, "queries": 0}
    held = {**base, "loop_s": 10.4, "cpu_s": 10.0, "train_rollouts": 1672, "queries": 9}
    data = {"ablation": base, "q_held": held, "rounds": [{"ablation": 10.0, "q_held": 10.4}]}
    assert tool._loop_ratio(data, "q_held").startswith("1.04x median of 1")
    assert tool._training_thread(data, "q_held") == (
        "CPU 10.0 s of a 10.4 s loop (off CPU 0.4 s, ablation 0.1 s); CPU / ablation's 1.01x; "
        "trained 1,672 vs 1,677 rollouts")
    assert tool._training_thread({"ablation": base, "feedback": {**held, "cpu_s": None}}, "feedback") == "not recorded"
    assert tool._training_thread({"ablation": base}, "feedback") == "not run (--arms)"


def test_goal1_divides_out_the_rollouts_each_round_trained():
    """L2RR's q changes how many rollouts a round trains: per round, the loop per trained rollout
    with feedback over the ablation's, and the median ratio of the rollouts themselves."""
    tool = load_tool()
    data = {"rounds": [{"ablation": 10.0, "feedback": 12.0}, {"ablation": 10.0, "feedback": 11.0},
                       {"ablation": 10.0, "feedback": 10.5}],
            "round_rollouts": [{"ablation": 1000, "feedback": 1100}, {"ablation": 1000, "feedback": 1000},
                               {"ablation": 1000, "feedback": 1050}]}
    text = tool._per_rollout_ratio(data, "feedback")
    # ratios 12/11 = 1.09, 1.10, 1.00: median 1.09; rollouts 1.10, 1.00, 1.05: median 1.05
    assert text.startswith("1.09x median of 3; geometric mean 1.06x") and text.endswith(
        "(trained rollouts: 1.05x the ablation's, median)")
    assert tool._per_rollout_ratio({"rounds": data["rounds"]}, "feedback") == "not recorded"  # older records
