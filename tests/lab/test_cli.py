"""`trainer-node simulate` and `trainer-node bench` reach the lab through the trainer's CLI,
which loads it lazily; without the lab or the owner package they say what to install."""

from __future__ import annotations

import sys

import pytest

from tests.import_blocker import BlockPackages
from trainer_node.cli import main


@pytest.mark.parametrize(("command", "expected"), [
    ("simulate", ["--method", "--no-dp", "--epsilon", "lab/configs/simulate_default.toml"]),
    ("bench", ["--profile", "--list-runs", "--report-only", "lab/bench/profiles/full.toml"]),
])
def test_lab_commands_show_the_labs_own_help(command, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: trainer-node {command}")
    for text in expected:
        assert text in out


def test_the_trainers_help_lists_the_lab_commands_without_loading_the_lab(capsys, monkeypatch):
    monkeypatch.delitem(sys.modules, "lab.cli", raising=False)
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "simulate" in out and "bench" in out and "train" in out
    assert "lab.cli" not in sys.modules


def test_flags_reach_the_lab_and_the_global_flag_still_works(tmp_path, capsys):
    assert main(["-v", "bench", "--profile", "quick", "--dry-run", "--out", str(tmp_path / "b")]) == 0
    assert "bench 'quick'" in capsys.readouterr().out


def test_unknown_arguments_of_the_trainers_own_commands_are_still_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--no-such-flag"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


@pytest.mark.parametrize(("blocked", "forget"), [
    ("lab", ["lab.cli"]),                            # a trainer-only install
    ("target_owner_node", ["lab.cli"]),              # the lab without the owner package
])
def test_without_the_lab_or_the_owner_the_commands_say_what_to_install(blocked, forget, monkeypatch, capsys):
    for name in [m for m in sys.modules if m.split(".")[0] == blocked] + forget:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "meta_path", [BlockPackages(blocked), *sys.meta_path])
    for command in ("simulate", "bench"):
        assert main([command, "--steps", "1"]) == 2
        err = capsys.readouterr().err
        assert f"`trainer-node {command}` is part of the lab" in err and f"lacks `{blocked}`" in err
        assert "pip install -e ." in err and "Traceback" not in err


def test_the_lab_runs_as_its_own_module_too(capsys):
    from lab.cli import main as lab_main

    with pytest.raises(SystemExit) as exit_info:
        lab_main(["simulate", "--method", "nope"])
    assert "choose one of" in str(exit_info.value.code) and "oracle" in str(exit_info.value.code)
