"""scripts/flower_deployment.sh (issue 44): a real deployment on this machine, every process its own
command (two `target-owner-node serve`, a `flower-superlink` with TLS and SuperNode authentication, a
`flower-supernode` per owner, the trainer's ServerApp by `flwr run`). One owner's SuperNode is killed
(SIGKILL) mid-run: training finishes with the other owner, and summary.json names the lost one.

The fast tests check the command line's refusals; the slow one runs it all (minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.federation.test_deployment import TESTBED, train_config
from trainer_node.federation.local_deployment import STATE_FILE, alive

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "flower_deployment.sh"


def script(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], check=False, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable})


def test_the_script_refuses_what_it_cannot_do_naming_it(tmp_path):
    done = script("down", str(tmp_path))
    assert done.returncode == 1 and f"no {STATE_FILE}" in done.stderr
    done = script("up", str(tmp_path), "--owners", "0")
    assert done.returncode == 2 and "--owners: at least 1 owner" in done.stderr
    (tmp_path / STATE_FILE).write_text(json.dumps({"port": 1, "pids": {}, "node_ids": {"owner0": 5}}))
    done = script("stop-supernode", str(tmp_path), "owner7")
    assert done.returncode == 1 and "no process 'supernode-owner7'" in done.stderr
    done = script("up", str(tmp_path))
    assert done.returncode == 1 and "a deployment is already there" in done.stderr


def wait_for_step(run_dir: Path, step: int, run: subprocess.Popen, timeout: float) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.poll() is None:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any(json.loads(line).get("step", -1) >= step for line in lines if '"kind": "train"' in line):
            return
        time.sleep(0.2)
    raise AssertionError(f"the run did not reach step {step} (flwr run exit {run.poll()})")


@pytest.mark.slow
def test_the_script_trains_over_a_deployment_and_names_the_owner_whose_supernode_was_killed(tmp_path):
    work = tmp_path / "flower"
    run_dir = work / "run"
    config = train_config(tmp_path, run_dir, steps=8)
    with config.open("a") as fh:
        fh.write("[owners]\ndrop_after_failures = 1  # one failed query: the killed owner is named at once\n")
    try:
        started = script("up", str(work), "--testbed", str(TESTBED))
        assert started.returncode == 0, started.stdout + started.stderr
        pids = json.loads((work / STATE_FILE).read_text())["pids"]
        assert set(pids) == {"owner-owner0", "owner-owner1", "superlink", "supernode-owner0", "supernode-owner1"}
        with open(tmp_path / "flwr-run.log", "w") as log:
            # the killed node is found offline once its heartbeats lapse (2 x 30 s in flwr 1.42)
            run = subprocess.Popen(["bash", str(SCRIPT), "run", str(work), "--train-config", str(config),
                                    "--message-timeout", "150"], stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHON": sys.executable})
            try:
                wait_for_step(run_dir, 1, run, timeout=420)
                killed = script("stop-supernode", str(work), "owner1")
                assert killed.returncode == 0, killed.stderr
                assert not alive(pids["supernode-owner1"], None)
                run.wait(timeout=420)
            finally:
                if run.poll() is None:
                    run.kill()
                    run.wait()
    finally:
        stopped = script("down", str(work))
    output = (tmp_path / "flwr-run.log").read_text()
    assert stopped.returncode == 0, stopped.stderr
    assert not any(alive(pid, None) for pid in pids.values())
    assert run.returncode == 0 and (run_dir / "summary.json").exists(), output[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["transport"] == "flower" and summary["steps"] == 8  # training finished
    assert [lost["owner"] for lost in summary["owners_lost"]] == ["owner1"], summary["owners_lost"]
    owners = summary["owners"]
    assert owners["owner1"]["lost_step"] >= 1 and "unreachable" in owners["owner1"]["lost_reason"]
    assert owners["owner0"]["lost_step"] is None and owners["owner0"]["epsilon_spent"] > 0
    assert owners["owner0"]["queries"] > owners["owner1"]["queries"]  # owner0 kept answering (the final release)
    assert "LOST at step" in output  # the script's own summary names it too
