import pytest

from trainer_node.cli import COMMANDS, build_parser, main


def test_help_teaches_the_train_command(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for flag in ("--config", "--steps", "--out", "--seed", "--resume", "example:"):
        assert flag in text
    assert len(COMMANDS) >= 1 and "train" in build_parser().format_help()


def test_train_help_tells_that_feedback_makes_it_the_owners_client(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "With one, train is the owner's client" in text and "exits non-zero" in text
    assert "check-owner" in text
    with pytest.raises(SystemExit):
        main(["check-owner", "--help"])
    assert "exit 0 when the owner answers" in capsys.readouterr().out.replace("\n", " ").lower()


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "train" in capsys.readouterr().out


def test_bad_config_is_one_clear_error(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text('[model]\ntiny = true\n[grpo]\nlr = -1\n')
    assert main(["train", "--config", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "grpo.lr" in err and "Traceback" not in err


MINI_TESTBED = """
name = "mini"
seed = 3
feedback_fraction = 0.5

[[source]]
task = "basic_arithmetic"
domain = "add"
size = 12
config = { min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1, operators = ["+"] }

[[target]]
task = "basic_arithmetic"
domain = "sub"
size = 4
config = { min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1, operators = ["-"] }
"""


def test_train_end_to_end_then_resume(tmp_path):
    from tests.trainer_node.grpo_helpers import make_model_dir
    from trainer_node.run_output import read_metrics

    (tmp_path / "mini.toml").write_text(MINI_TESTBED)
    run_dir = tmp_path / "run"
    config = tmp_path / "train.toml"
    config.write_text(f"""
[model]
path = "{make_model_dir(tmp_path)}"
[data]
testbed = "{tmp_path / 'mini.toml'}"
eval_size = 4
[policy]
batch_size = 2
rollouts_per_prompt = 2
[rollout]
max_new_tokens = 4
[run]
steps = 2
out_dir = "{run_dir}"
eval_every = 1
save_every = 1
""")
    assert main(["train", "--config", str(config), "--no-progress"]) == 0
    for name in ("metrics.jsonl", "summary.json", "resolved_config.json", "reward_vs_step.png",
                 "accuracy_vs_rollouts.png", "checkpoints/step_000001", "checkpoints/step_000002"):
        assert (run_dir / name).exists(), name
    assert main(["train", "--config", str(config), "--steps", "3", "--resume", str(run_dir), "--no-progress"]) == 0
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == [0, 1, 2]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 1, 2, 3]
    assert [r["rollouts_cumulative"] for r in records if r["kind"] == "train"] == [4, 8, 12]
