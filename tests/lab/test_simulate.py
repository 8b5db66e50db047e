"""`trainer-node simulate` end to end with a handful of steps, and its owner-process care."""

import json
import os
import signal

import pytest

from lab.owner_process import OwnerProcess, OwnerProcessError, init_owner
from lab.simulate import SUMMARY_KEYS
from tests.trainer_node.grpo_helpers import make_model_dir
from trainer_node.cli import main


@pytest.fixture(scope="module")
def small_owner(tmp_path_factory):
    directory = tmp_path_factory.mktemp("owner") / "node"
    init_owner(directory, "small", dp=True, sample_rate=1.0, planned_releases=50)
    return directory


def test_simulate_runs_end_to_end_and_leaves_no_owner_process(tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = _tiny_sim_config(tmp_path, run_dir, "l2rr", steps=2, eval_every=1)
    assert main(["simulate", "--config", str(config), "--no-progress", "--epsilon", "4"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in SUMMARY_KEYS:
        assert key in summary, key
    assert summary["method"] == "l2rr" and summary["steps"] == 2 and summary["testbed"] == "small"
    assert 0.0 <= summary["target_accuracy_before"] <= 1.0
    assert summary["epsilon_budget"] == 4.0 and 0.0 <= summary["epsilon_spent"] <= 4.0
    assert summary["rollouts"] > 0
    # the answer base rates of the simulation's own test split, and the skill beyond them
    assert 0.0 < summary["base_rates"]["commonest_answer_accuracy"] <= 1.0
    assert summary["base_rates"]["n"] > summary["base_rates"]["uncommon_n"] > 0
    assert 0.0 <= summary["target_accuracy_uncommon_before"] <= 1.0
    assert 0.0 <= summary["target_accuracy_uncommon_after"] <= 1.0
    assert len(summary["initial_checkpoint_sha256"]) == 64
    for name in ("metrics.jsonl", "resolved_config.json", "reward_vs_step.png", "accuracy_vs_rollouts.png"):
        assert (run_dir / name).exists(), name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 1, 2]  # before, every step, after
    out = capsys.readouterr().out
    assert "target test accuracy" in out and "epsilon spent" in out
    # only the owner process read the target data: the trainer's run dir holds no copy of it
    owner_pid_files = list((run_dir / "owner").glob("*.jsonl"))
    assert {p.name for p in owner_pid_files} == {"heldout.jsonl", "test.jsonl"}


def test_owner_death_is_a_clear_error_and_stop_is_clean(small_owner):
    owner = OwnerProcess(small_owner)
    owner.start()
    try:
        owner.check_alive()
        os.kill(owner.proc.pid, signal.SIGKILL)
        owner.proc.wait(timeout=10)
        with pytest.raises(OwnerProcessError, match="target-owner process exited"):
            owner.check_alive()
    finally:
        owner.stop()
    assert owner.proc.poll() is not None


def test_bad_simulate_config_is_one_clear_error(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text('[model]\ntiny = true\n[policy]\nname = "nope"\n')
    assert main(["simulate", "--config", str(config)]) == 2
    assert "policy.name" in capsys.readouterr().err


def test_owner_exits_when_its_trainer_parent_is_killed(small_owner, tmp_path):
    """A SIGKILLed simulate must not leave an orphaned owner process behind."""
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from lab.owner_process import OwnerProcess\n"
        f"owner = OwnerProcess({str(small_owner)!r})\n"
        "owner.start()\n"
        "print(owner.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    owner_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait(timeout=10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(owner_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.kill(owner_pid, signal.SIGKILL)
    pytest.fail("the owner process outlived its killed parent")


def _tiny_sim_config(tmp_path, run_dir, policy, extra="", steps=4, eval_every=0, policy_fields=""):
    config = tmp_path / "sim.toml"
    config.write_text(f"""
[model]
path = "{make_model_dir(tmp_path)}"
[data]
testbed = "small"
eval_size = 0
[policy]
name = "{policy}"
batch_size = 4
rollouts_per_prompt = 2
{policy_fields}
[rollout]
max_new_tokens = 4
[run]
steps = {steps}
out_dir = "{run_dir}"
eval_every = {eval_every}
{extra}
""")
    return config


def test_simulate_selects_a_checkpoint_by_target_feedback(tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = _tiny_sim_config(tmp_path, run_dir, "uniform", "[selection]\nevery = 2\n")
    assert main(["simulate", "--config", str(config), "--no-progress"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["selection"]["candidate_steps"] == [2, 4]
    assert summary["selection"]["selected_step"] in (2, 4)
    assert len(summary["selection"]["released_accuracy"]) == 2
    assert 0.0 <= summary["target_accuracy_selected"] <= 1.0
    assert summary["feedback_queries"] == 1 and summary["releases"] == 1  # uniform: only the selection release
    assert summary["epsilon_spent"] > 0  # charged like any release
    assert "selected checkpoint" in capsys.readouterr().out
    evals = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert [e["name"] for e in evals] == ["target_test", "target_test", "target_test_selected"]


def test_simulate_target_mix_trains_on_the_feedback_split(tmp_path):
    from lab.simulate import SimulateOptions, resolve_config

    run_dir = tmp_path / "run"
    config = _tiny_sim_config(tmp_path, run_dir, "uniform")
    resolved = resolve_config(SimulateOptions(method="target_mix", config=config))
    assert resolved.policy.name == "uniform" and resolved.data.train_on_feedback_split
    assert main(["simulate", "--config", str(config), "--method", "target_mix", "--no-progress"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["diagnostic"] == "target_mix" and summary["method"] == "uniform"


def test_target_mix_pool_adds_the_feedback_split_but_not_the_test_split(tmp_path):
    from lab.simulate import target_mix_pool
    from trainer_node.config import ConfigError, load_config
    from trainer_node.training import build_training

    config = _tiny_sim_config(tmp_path, tmp_path / "run", "uniform")
    plain = build_training(load_config(config))
    mix_config = load_config(config, {"data.train_on_feedback_split": True})
    mixed = build_training(mix_config, extend_pool=target_mix_pool)
    assert len(mixed.pool) == len(plain.pool) + len(plain.data.feedback)
    prompts = {e.prompt for e in mixed.pool.examples}
    assert all(e.prompt in prompts for e in plain.data.feedback)
    assert not any(e.prompt in prompts for e in plain.data.test)
    # the trainer alone never adds target data to its pool: only the lab's extension does
    with pytest.raises(ConfigError, match="train_on_feedback_split"):
        build_training(mix_config)


def test_oracle_gets_the_target_composition_in_simulation(tmp_path):
    from lab.simulate import SimulateOptions, resolve_config
    from rlvr_core.tasks.testbed import load_testbed, target_composition

    config = _tiny_sim_config(tmp_path, tmp_path / "run", "oracle")
    resolved = resolve_config(SimulateOptions(config=config))
    assert resolved.policy.domain_weights == target_composition(load_testbed("small"))


def test_train_refuses_simulation_only_options(tmp_path):
    from trainer_node.config import ConfigError, load_config
    from trainer_node.training import run_training

    config = _tiny_sim_config(tmp_path, tmp_path / "run", "uniform")
    with pytest.raises(ConfigError, match="train_on_feedback_split"):
        run_training(load_config(config, {"data.train_on_feedback_split": True}), progress=False)
    with pytest.raises(ConfigError, match="selection.every"):
        run_training(load_config(config, {"selection.every": 2}), progress=False)


def test_train_refuses_a_simulation_only_policy(tmp_path):
    """The oracle is registered (the lab is imported) and fully configured, yet `train` refuses it
    before building anything: it is marked simulation_only."""
    from lab.policies.oracle import OraclePolicy
    from trainer_node.config import ConfigError, load_config
    from trainer_node.training import run_training

    assert OraclePolicy.simulation_only
    config = _tiny_sim_config(tmp_path, tmp_path / "run", "oracle",
                              policy_fields='domain_weights = { "add" = 1.0 }')
    with pytest.raises(ConfigError, match="simulation-only") as error:
        run_training(load_config(config), progress=False)
    assert "policy.name" in str(error.value) and "trainer-node simulate --method oracle" in str(error.value)
    assert not (tmp_path / "run").exists()


def test_unknown_simulate_method_names_the_choices(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--method", "nope"])
    assert exit_info.value.code != 0
    assert "target_mix" in str(exit_info.value.code) and "uniform" in str(exit_info.value.code)


def test_train_with_a_remote_owner_gets_its_final_release(small_owner, tmp_path):
    """`train`'s [feedback] path through the same loop and wiring simulate uses: a uniform run
    asks the owner only for the final release, which is logged and summarised."""
    run_dir = tmp_path / "run"
    with OwnerProcess(small_owner) as owner:
        settings = owner.client_settings()
        config = _tiny_sim_config(tmp_path, run_dir, "uniform", f"""
[feedback]
target = "{settings.target}"
ca_cert = "{settings.ca_cert}"
client_cert = "{settings.client_cert}"
client_key = "{settings.client_key}"
server_name = "localhost"
""", steps=2)
        assert main(["train", "--config", str(config), "--no-progress"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["feedback_queries"] == 1 and summary["feedback_failures"] == 0
    assert 0.0 <= summary["target_feedback_accuracy"] <= 1.0 and summary["epsilon_spent"] > 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["name"] for r in records if r["kind"] == "eval"] == ["target_feedback"]  # eval_size = 0
    assert all(r["feedback_queries"] == 0 for r in records if r["kind"] == "train")
    assert (run_dir / "checkpoints" / "step_000002").is_dir()
