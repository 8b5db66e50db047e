"""Lifecycle of `target-owner-node serve` as operators run it (real evaluation worker).

SIGTERM while an Evaluate is in flight: the evaluation completes and reaches the trainer,
the process exits 0. A restart loses nothing and double-charges nothing: after it (a fresh
node opened on the same storage folder), the trainer's retry of the same request_id is
answered from the ledger with the same values at no extra epsilon.

(tests/target_owner_node/test_cli.py covers SIGKILL mid-evaluation and health NOT_SERVING
during the drain; tests/target_owner_node/test_release.py covers resuming a charged but
never completed release after a restart.)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from target_owner_node.cli import main as owner_cli
from trainer_node.feedback.client import TargetFeedbackClient

from .conftest import (
    client_settings,
    decoding,
    in_process_owner,
    owner_config,
    read_jsonl,
    serving,
    wait_for,
    write_toml,
)


def test_sigterm_drains_inflight_evaluate_and_restart_double_charges_nothing(
    tmp_path, data_dir, two_orgs, tiny_checkpoint
):
    storage = tmp_path / "storage"
    raw = owner_config(storage, data_dir, two_orgs, server={"shutdown_grace_s": 240.0, "drain_delay_s": 0.5})
    config_path = write_toml(tmp_path / "config.toml", raw)
    ledger, log_path = storage / "privacy_ledger.jsonl", tmp_path / "serve.log"

    with serving(config_path, log_path) as serve:
        settings = client_settings(two_orgs, f"localhost:{serve.port}", evaluate_deadline_s=240)
        with TargetFeedbackClient(settings) as client, ThreadPoolExecutor(1) as pool:
            checkpoint_id = client.upload(tiny_checkpoint)
            # The worker imports torch + transformers on its first evaluation: seconds during
            # which this Evaluate is surely still in flight when SIGTERM arrives.
            pending = pool.submit(client.evaluate, [checkpoint_id], decoding(), request_id="drain-1")
            wait_for(lambda: ledger.exists() and ledger.read_text().endswith("\n"), 60, "the ledger charge")
            assert not pending.done(), "the evaluation finished before SIGTERM; the test proves nothing"
            serve.terminate()
            response = pending.result(timeout=240)
        assert serve.wait(timeout=60) == 0
    assert [entry["type"] for entry in read_jsonl(ledger)] == ["pending", "completed"]
    spent = response.privacy.epsilon_spent_total
    assert spent > 0 and len(response.results) == 1

    # Restart: a fresh node on the same storage (in-process; the replay never reaches a worker).
    with in_process_owner(raw, tmp_path) as restarted:
        settings = client_settings(two_orgs, f"localhost:{restarted.port}")
        with TargetFeedbackClient(settings) as client:
            budget = client.budget()
            assert budget.epsilon_spent == pytest.approx(spent) and budget.releases_made == 1
            again = client.evaluate([checkpoint_id], decoding(), request_id="drain-1")
            assert again.release_id == response.release_id
            assert again.results[0].accuracy == response.results[0].accuracy
            assert client.budget().epsilon_spent == pytest.approx(spent), "a retry must not be charged again"
    assert [entry["type"] for entry in read_jsonl(ledger)] == ["pending", "completed"]
    log = log_path.read_text()
    assert "CANARY" not in log and '"event": "stopped"' in log
    assert owner_cli(["audit", "verify", "--config", str(config_path)]) == 0
