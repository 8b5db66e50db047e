"""`trainer-node simulate --owners N`: the flags and their errors (the runs: test_simulation.py)."""

import pytest

from trainer_node.cli import main


@pytest.mark.parametrize("argv, message", [
    (["--owners", "0"], "--owners must be at least 1"),
    (["--aggregation", "mixture"], "need --owners N with N > 1"),
    (["--learn-from", "owner0"], "need --owners N with N > 1"),
])
def test_owner_flags_are_checked_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", *argv])
    assert message in str(exit_info.value) + capsys.readouterr().err


def test_the_help_names_the_owner_flags(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = capsys.readouterr().out
    assert "--owners" in out and "--learn-from" in out and "Flower" in out
