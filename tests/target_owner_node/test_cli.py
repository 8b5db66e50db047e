"""The `target-owner-node` command: serve as a subprocess (SIGKILL durability, SIGTERM drain),
startup refusals with clear messages, and --help."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from target_owner_node.cli import main

from .conftest import RecordingClient, config_dict, read_jsonl, write_toml


def _spawn(config_path: Path, log_path: Path) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "target_owner_node.cli", "serve", "--config", str(config_path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=log_path.open("ab"),
        text=True,
        start_new_session=True,
    )
    line = process.stdout.readline()
    assert line.startswith("listening on "), (
        f"serve did not start: {line!r}; log: {log_path.read_text()[-2000:]}"
    )
    return process, int(line.rsplit(":", 1)[1])


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def test_spend_survives_sigkill_and_sigterm_drains(tmp_path, data_dir, pki, tiny_checkpoint):
    """SIGKILL the whole node (server + worker, like a power cut) right after the ledger
    write, mid-evaluation: after a restart the spend is still there. Then SIGTERM drains."""
    raw = config_dict(
        tmp_path,
        data_dir,
        pki,
        privacy={"planned_releases": 5, "epsilon_budget": 1.0},
        server={"drain_delay_s": 1.5, "shutdown_grace_s": 5.0},
    )
    config_path = write_toml(tmp_path / "config.toml", raw)
    log_path = tmp_path / "serve.log"
    ledger = tmp_path / "storage" / "privacy_ledger.jsonl"
    process, port = _spawn(config_path, log_path)
    client = RecordingClient(port, pki)
    try:
        checkpoint_id = client.upload_dir(tiny_checkpoint).checkpoint_id
        call = client.channel.unary_unary(
            "/target_feedback.v1.TargetFeedbackService/Evaluate",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.EvaluateResponse.FromString,
        ).future(
            pb.EvaluateRequest(
                checkpoint_ids=[checkpoint_id],
                request_id="before-kill",
                decoding=pb.DecodingSettings(max_new_tokens=4, samples_per_prompt=1),
            )
        )
        _wait_for(lambda: ledger.exists() and ledger.read_text().endswith("\n"))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        with pytest.raises(grpc.RpcError):
            call.result(timeout=30)
    finally:
        client.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert [entry["type"] for entry in read_jsonl(ledger)] == ["pending"]

    process, port = _spawn(config_path, log_path)
    client = RecordingClient(port, pki)
    try:
        budget = client.budget()
        assert budget.epsilon_spent > 0 and budget.releases_made == 1
        assert budget.epsilon_spent == pytest.approx(read_jsonl(ledger)[0]["epsilon_total_after"])
        health = health_pb2_grpc.HealthStub(client.channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert (
            health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            == health_pb2.HealthCheckResponse.NOT_SERVING
        )
        assert process.wait(timeout=30) == 0
    finally:
        client.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    log = log_path.read_text()
    assert "CANARY" not in log and '"event": "stopped"' in log
    assert main(["audit", "verify", "--config", str(config_path)]) == 0


def test_serve_refusals_are_clear(tmp_path, data_dir, pki, capsys):
    raw = config_dict(tmp_path, data_dir, pki, data={"min_heldout_size": 500})
    config_path = write_toml(tmp_path / "config.toml", raw)
    assert main(["serve", "--config", str(config_path)]) == 2
    assert "data.min_heldout_size is 500" in capsys.readouterr().err
    raw = config_dict(tmp_path, data_dir, pki, privacy={"delta": 2.0})
    assert main(["serve", "--config", str(write_toml(tmp_path / "bad.toml", raw))]) == 2
    assert "privacy.delta: must be in (0, 1); got 2" in capsys.readouterr().err


def test_help_teaches(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "init" in text and "serve" in text and "audit" in text and "Typical first run" in text


def test_init_writes_a_servable_node(tmp_path, capsys):
    from target_owner_node.config import load_config
    from target_owner_node.heldout import load_split, split_facts

    canaries = tmp_path / "canaries.txt"
    canaries.write_text("CANARYinit0001\nCANARYinit0002\n")
    node = tmp_path / "node"
    assert (
        main(["init", str(node), "--testbed", "small", "--epsilon", "2.5", "--canary-file", str(canaries)])
        == 0
    )
    out = capsys.readouterr().out
    assert "client.pem" in out and "client.key" in out and "ca.pem" in out
    # init's single-CA files are for a rehearsal: across two organizations no private key crosses.
    assert "rehearsal on ONE machine" in out and "no private key crosses" in out
    config = load_config(node / "config.toml")
    assert config.privacy.epsilon_budget == 2.5 and config.access.allowed_clients == ["trainer"]
    assert config.tls.server_key == node / "pki" / "server.key" and (node / "storage").is_dir()
    facts = split_facts(
        config.data.heldout_path, config.data.test_path, "per_example", config.data.min_heldout_size
    )
    assert facts.heldout_size >= 100 and facts.test_size > 0
    heldout = load_split(config.data.heldout_path, "per_example")
    assert "CANARYinit0001" in heldout[0].prompt and "CANARYinit0002" in heldout[1].answer
    assert oct((node / "pki" / "server.key").stat().st_mode & 0o777) == "0o600"
    assert main(["init", str(node)]) == 2  # never overwrites
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize("planned", [150, 1000, 2000, 100_000])
def test_init_and_launch_write_a_row_cap_tail_their_planned_releases_allow(tmp_path, data_dir, pki, planned):
    """row_cap_tail x planned_releases must stay within a tenth of delta: init and launch pick such a tail
    (init --planned-releases 2000 used to write 1e-10, which serve then refused)."""
    from target_owner_node.config import load_config
    from target_owner_node.launch import LaunchOptions, write_launch_config

    assert main(["init", str(tmp_path / "node"), "--testbed", "small", "--planned-releases", str(planned)]) == 0
    config = load_config(tmp_path / "node" / "config.toml")  # the validator serve runs
    assert config.privacy.planned_releases == planned
    assert config.privacy.row_cap_tail * planned <= config.privacy.delta / 10
    assert config.privacy.row_cap_tail == (1e-10 if planned <= 500 else config.privacy.row_cap_tail)
    launched = write_launch_config(LaunchOptions(
        heldout=data_dir / "heldout.jsonl", port=0, workdir=tmp_path / "launch", ca=pki["ca_cert"],
        cert=pki["server_cert"], key=pki["server_key"], planned_releases=planned))
    assert load_config(launched).privacy.row_cap_tail * planned <= 1e-7


def test_launch_serves_a_held_out_file_like_serve(tmp_path, data_dir, pki):
    """`launch` (the suite's --launch-cmd): a config for one held-out file, served in the foreground."""
    from rlvr_core.tasks.io import read_examples, write_examples

    heldout = tmp_path / "suite-heldout.jsonl"
    write_examples(heldout, read_examples(data_dir / "heldout.jsonl")[:30])
    workdir = tmp_path / "launched"
    command = [
        sys.executable, "-m", "target_owner_node.cli", "launch", "--heldout", str(heldout), "--port", "0",
        "--workdir", str(workdir), "--ca", str(pki["ca_cert"]), "--cert", str(pki["server_cert"]),
        "--key", str(pki["server_key"]), "--sample-rate", "0.5", "--epsilon", "2", "--planned-releases", "20",
        "--verifier", "exact_match", "--prompt-template", "Q: {prompt}",
    ]
    log_path = tmp_path / "launch.log"
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_path.open("ab"), text=True,
                               start_new_session=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), f"{line!r}; log: {log_path.read_text()[-2000:]}"
        client = RecordingClient(int(line.rsplit(":", 1)[1]), pki)
        try:
            info = client.info()
            assert info.heldout_size == 30 and info.privacy.enabled and info.privacy.sample_rate == 0.5
            assert info.privacy.epsilon_budget == 2.0 and info.prompt_template == "Q: {prompt}"
            assert not info.test_split_enabled and client.budget().epsilon_spent == 0.0
        finally:
            client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    from target_owner_node.config import load_config

    config = load_config(workdir / "config.toml")
    assert config.data.min_heldout_size == 30 and config.storage.dir == workdir / "storage"
    assert config.data.verifier == "exact_match" and not config.data.test_split_enabled


def test_launch_refuses_a_missing_held_out_file(tmp_path, pki, capsys):
    assert main(["launch", "--heldout", str(tmp_path / "nope.jsonl"), "--port", "0", "--workdir", str(tmp_path / "w"),
                 "--ca", str(pki["ca_cert"]), "--cert", str(pki["server_cert"]), "--key", str(pki["server_key"])]) == 2
    assert "data file not found" in capsys.readouterr().err


def test_help_names_the_ledger_recovery_and_the_launch_contract(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "ledger rebuild --config" in text and "launch" in text
    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    assert "--launch-cmd" in capsys.readouterr().out
