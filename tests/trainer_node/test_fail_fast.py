"""Fail fast, and say why: `trainer-node train` with a [feedback] owner stops within seconds, naming the
setting to fix, on a wrong CA, a wrong server name, a missing file, an owner that refuses it and (with
feedback.required, the default) an unreachable owner; `check-owner` prints the card and exits 0 or 1;
a budget that runs out mid-run is not a failure, and the summary says when and why feedback stopped."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from tests.deploy.conftest import StubScorer, in_process_owner, owner_config
from tests.rlvr_core.model_folders import save_pretrained_folder
from tests.trainer_node.mini_testbed import MINI_TESTBED, mini_run_sections
from trainer_node.cli import main

FAST_S = 10.0  # "within seconds": the model is never built, nothing is retried


@pytest.fixture()
def owner(orgs, data_dir, tmp_path):
    ours, _ = orgs
    with in_process_owner(owner_config(tmp_path / "storage", data_dir, ours), tmp_path) as running:
        yield running


def write_config(tmp_path: Path, target: str, orgs, model: str = "tiny = true", **feedback: str) -> Path:
    ours, _ = orgs
    values = {"target": target, "ca_cert": str(ours.owner_ca_cert), "client_cert": str(ours.client_cert),
              "client_key": str(ours.client_key), **feedback}
    lines = "\n".join(f"{key} = {value}" if key in ("required", "max_attempts") else f'{key} = "{value}"'
                      for key, value in values.items())
    config = tmp_path / "train.toml"
    config.write_text(mini_run_sections(tmp_path, model) + f"""[feedback]
{lines}
""")
    (tmp_path / "mini.toml").write_text(MINI_TESTBED)
    return config


def train_fails(config: Path, capsys, *expected: str) -> str:
    started = time.monotonic()
    code = main(["train", "--config", str(config), "--no-progress"])
    seconds = time.monotonic() - started
    err = capsys.readouterr().err
    assert code != 0 and seconds < FAST_S, (code, seconds, err)
    for text in expected:
        assert text in err, f"{text!r} not in: {err}"
    assert "Traceback" not in err
    return err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_wrong_ca_stops_train_naming_ca_cert(owner, orgs, tmp_path, capsys):
    _, theirs = orgs
    config = write_config(tmp_path, f"localhost:{owner.port}", orgs, ca_cert=str(theirs.owner_ca_cert))
    train_fails(config, capsys, "feedback.ca_cert", "not signed by the CA", "OWNER organization's ca.pem")


def test_a_wrong_server_name_stops_train_naming_server_name(owner, orgs, tmp_path, capsys):
    config = write_config(tmp_path, f"localhost:{owner.port}", orgs, server_name="owner.example.org")
    train_fails(config, capsys, "feedback.server_name", "does not name 'owner.example.org'")


def test_a_missing_file_stops_train_naming_the_setting_and_the_file(owner, orgs, tmp_path, capsys):
    config = write_config(tmp_path, f"localhost:{owner.port}", orgs, client_key="tls/nowhere.key")
    train_fails(config, capsys, "feedback.client_key: file not found", str(tmp_path / "tls" / "nowhere.key"))


def test_a_client_certificate_of_another_ca_is_refused_at_the_handshake(owner, orgs, tmp_path, capsys):
    _, theirs = orgs
    config = write_config(tmp_path, f"localhost:{owner.port}", orgs, client_cert=str(theirs.client_cert),
                          client_key=str(theirs.client_key))
    train_fails(config, capsys, "feedback.client_cert", "refused", "TRAINER organization's ca.pem")


def test_an_owner_that_does_not_allow_this_client_stops_train(orgs, data_dir, tmp_path, capsys):
    ours, _ = orgs
    raw = owner_config(tmp_path / "storage", data_dir, ours, access={"allowed_clients": ["someone-else"]})
    with in_process_owner(raw, tmp_path) as running:
        config = write_config(tmp_path, f"localhost:{running.port}", orgs)
        train_fails(config, capsys, "feedback.client_cert", "PERMISSION_DENIED", "allowed_clients")


def test_an_unreachable_owner_stops_train_when_required(orgs, tmp_path, capsys):
    config = write_config(tmp_path, f"127.0.0.1:{free_port()}", orgs)
    train_fails(config, capsys, "feedback.target: cannot connect", "feedback.required = false")


def test_required_false_tolerates_an_unreachable_owner(orgs, tmp_path, caplog):
    model = save_pretrained_folder(tmp_path / "models")
    config = write_config(tmp_path, f"127.0.0.1:{free_port()}", orgs, model=f'path = "{model}"',
                          required="false", max_attempts="1")
    with caplog.at_level("WARNING"):
        assert main(["train", "--config", str(config), "--no-progress"]) == 0
    assert "feedback.required = false" in caplog.text
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["feedback_queries"] == 0 and summary["feedback_failures"] >= 1


def test_check_owner_prints_the_card_and_budget_and_exits_0_or_1(owner, orgs, tmp_path, capsys):
    config = write_config(tmp_path, f"localhost:{owner.port}", orgs)
    assert main(["check-owner", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"connected to localhost:{owner.port}" in out and "110 held-out rows" in out and "epsilon budget 1" in out
    only_feedback = tmp_path / "feedback.toml"
    only_feedback.write_text(config.read_text().split("[feedback]")[1].join(["[feedback]", ""]))
    assert main(["check-owner", "--config", str(only_feedback)]) == 0
    _, theirs = orgs
    wrong = write_config(tmp_path, f"localhost:{owner.port}", orgs, ca_cert=str(theirs.owner_ca_cert))
    assert main(["check-owner", "--config", str(wrong)]) == 1
    assert "feedback.ca_cert" in capsys.readouterr().err


def test_a_budget_that_runs_out_mid_run_is_not_a_failure(orgs, data_dir, tmp_path):
    """Two single releases' worth of budget: the first L2RR query (two candidates) spends it; training
    finishes all its steps and the summary says when feedback stopped and why."""
    ours, _ = orgs
    raw = owner_config(tmp_path / "storage", data_dir, ours, privacy={"epsilon_budget": 1.0, "planned_releases": 2})
    model = save_pretrained_folder(tmp_path / "models")
    with in_process_owner(raw, tmp_path, scorer=StubScorer(0.5)) as running:
        config = write_config(tmp_path, f"localhost:{running.port}", orgs, model=f'path = "{model}"')
        assert main(["train", "--config", str(config), "--no-progress"]) == 0
    from trainer_node.run_output import read_metrics

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"] == [0, 1, 2]
    assert summary["feedback_queries"] >= 1
    assert summary["feedback_stopped_step"] <= 3 and "budget" in summary["feedback_stopped_reason"]
