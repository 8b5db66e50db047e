"""Two "hosts" on one machine: the owner and the trainer in two network namespaces joined
by a veth pair (private /30 addresses that exist only inside those namespaces).

The owner runs `target-owner-node serve` in its namespace with a server certificate whose
SAN is its veth IP; the trainer, from the other namespace, dials that IP over mTLS and
runs a short session (GetInfo, upload a tiny checkpoint, Evaluate, GetBudget). Neither
loopback nor the machine's own network is involved: the owner is unreachable from the
test's namespace. A second test runs `trainer-node train --config` (2 steps) the same way
once the trainer's run config has a [feedback] section (it skips until then). Both skip,
with the reason, where namespaces cannot be created (not root, no `ip`, not permitted).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import REPO, make_two_orgs, owner_config, read_jsonl, serving, write_toml

pytestmark = pytest.mark.netns

OWNER_IP, TRAINER_IP = "10.213.7.1", "10.213.7.2"


@dataclass(frozen=True)
class Hosts:
    owner_ns: str
    trainer_ns: str

    def exec_in(self, namespace: str) -> tuple[str, ...]:
        return ("ip", "netns", "exec", namespace)


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=30)


def _must(*args: str) -> None:
    result = _ip(*args)
    assert result.returncode == 0, f"ip {' '.join(args)}: {result.stderr.strip()}"


@pytest.fixture()
def hosts() -> Iterator[Hosts]:
    if shutil.which("ip") is None:
        pytest.skip("`ip` (iproute2) is not installed: apt-get install iproute2")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN)")
    pid = os.getpid()
    owner_ns, trainer_ns = f"tfg-owner-{pid}", f"tfg-trainer-{pid}"
    veth_owner, veth_trainer = f"tfgo{pid}"[:15], f"tfgt{pid}"[:15]
    created: list[str] = []
    try:
        for namespace in (owner_ns, trainer_ns):
            result = _ip("netns", "add", namespace)
            if result.returncode != 0:
                pytest.skip(f"`ip netns add` is not permitted here: {result.stderr.strip()}")
            created.append(namespace)
        _must("link", "add", veth_owner, "type", "veth", "peer", "name", veth_trainer)
        _must("link", "set", veth_owner, "netns", owner_ns)
        _must("link", "set", veth_trainer, "netns", trainer_ns)
        for namespace, device, address in ((owner_ns, veth_owner, OWNER_IP), (trainer_ns, veth_trainer, TRAINER_IP)):
            _must("-n", namespace, "addr", "add", f"{address}/30", "dev", device)
            _must("-n", namespace, "link", "set", device, "up")
            _must("-n", namespace, "link", "set", "lo", "up")
        yield Hosts(owner_ns, trainer_ns)
    finally:
        for namespace in created:  # deleting a namespace also deletes its end of the veth pair
            _ip("netns", "del", namespace)
        _ip("link", "del", veth_owner)  # only exists if moving it into the namespace failed


TRAINER_SESSION = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
    from trainer_node.feedback.client import ClientSettings, TargetFeedbackClient

    target, ca, cert, key, checkpoint = sys.argv[1:6]
    settings = ClientSettings(target=target, ca_cert=Path(ca), client_cert=Path(cert), client_key=Path(key),
                              max_attempts=3, backoff_initial_s=0.2, evaluate_deadline_s=240)
    with TargetFeedbackClient(settings) as client:
        info = client.info()
        checkpoint_id = client.upload(Path(checkpoint))
        decoding = pb.DecodingSettings(max_new_tokens=4, samples_per_prompt=1, temperature=0.0, seed=1)
        result = client.evaluate([checkpoint_id], decoding, request_id="two-hosts-1")
        budget = client.budget()
    print(json.dumps({
        "heldout_size": info.heldout_size, "checkpoint_id": checkpoint_id,
        "accuracy": result.results[0].accuracy, "epsilon_spent_total": result.privacy.epsilon_spent_total,
        "budget_spent": budget.epsilon_spent, "releases_made": budget.releases_made,
    }))
    """
)


def test_trainer_and_owner_in_two_network_namespaces(hosts, tmp_path, data_dir, tiny_checkpoint):
    orgs = make_two_orgs(tmp_path / "orgs", server_names=("owner.internal", OWNER_IP))
    storage = tmp_path / "storage"
    raw = owner_config(storage, data_dir, orgs, listen=f"{OWNER_IP}:0", server={"shutdown_grace_s": 30.0})
    config_path = write_toml(tmp_path / "config.toml", raw)
    with serving(config_path, tmp_path / "serve.log", prefix=hosts.exec_in(hosts.owner_ns)) as serve:
        # The owner's address does not exist outside the two namespaces.
        with pytest.raises(OSError), socket.create_connection((OWNER_IP, serve.port), timeout=1):
            pass
        session = subprocess.run(
            [*hosts.exec_in(hosts.trainer_ns), sys.executable, "-c", TRAINER_SESSION,
             f"{OWNER_IP}:{serve.port}", str(orgs.owner_ca_cert), str(orgs.client_cert),
             str(orgs.client_key), str(tiny_checkpoint)],
            check=False, capture_output=True, text=True, timeout=300, cwd=REPO,
        )
        assert session.returncode == 0, f"trainer session failed:\n{session.stderr[-3000:]}\nowner log:\n{serve.log()[-3000:]}"
        result = json.loads(session.stdout.strip().splitlines()[-1])
        serve.terminate()
        assert serve.wait(timeout=60) == 0
    assert result["heldout_size"] == 110 and 0.0 <= result["accuracy"] <= 1.0
    assert result["epsilon_spent_total"] > 0
    assert result["budget_spent"] == pytest.approx(result["epsilon_spent_total"])
    assert result["releases_made"] == 1
    audit = read_jsonl(storage / "audit.jsonl")
    assert [entry["event"] for entry in audit] == ["upload", "release_charged", "release"]
    assert audit[2]["client"] == "trainer" and audit[2]["dp"] is True
    assert "CANARY" not in session.stdout + session.stderr + Path(tmp_path / "serve.log").read_text()


def _trainer_has_feedback_config() -> bool:
    from trainer_node.config import TrainConfig

    return "feedback" in TrainConfig.model_fields


@pytest.mark.slow
def test_two_step_training_run_across_namespaces(hosts, tmp_path, data_dir):
    """`trainer-node train --config` with a [feedback] section, from the trainer namespace."""
    if not _trainer_has_feedback_config():
        pytest.skip("trainer_node/config.py has no [feedback] section yet; the client session test covers the wire")
    orgs = make_two_orgs(tmp_path / "orgs", server_names=("owner.internal", OWNER_IP))
    storage = tmp_path / "storage"
    raw = owner_config(storage, data_dir, orgs, listen=f"{OWNER_IP}:0", server={"shutdown_grace_s": 30.0})
    config_path = write_toml(tmp_path / "config.toml", raw)
    with serving(config_path, tmp_path / "serve.log", prefix=hosts.exec_in(hosts.owner_ns)) as serve:
        run_config = tmp_path / "train.toml"
        run_config.write_text(
            (REPO / "trainer_node" / "configs" / "train_default.toml").read_text()
            + "\n[feedback]\n"
            + f'target = "{OWNER_IP}:{serve.port}"\nca_cert = "{orgs.owner_ca_cert}"\n'
            + f'client_cert = "{orgs.client_cert}"\nclient_key = "{orgs.client_key}"\n'
        )
        run = subprocess.run(
            [*hosts.exec_in(hosts.trainer_ns), sys.executable, "-m", "trainer_node.cli", "train",
             "--config", str(run_config), "--steps", "2", "--out", str(tmp_path / "run"), "--no-progress"],
            check=False, capture_output=True, text=True, timeout=900, cwd=REPO,
        )
        assert run.returncode == 0, f"training failed:\n{run.stderr[-4000:]}\nowner log:\n{serve.log()[-2000:]}"
        serve.terminate()
        assert serve.wait(timeout=60) == 0
    releases = [e for e in read_jsonl(storage / "audit.jsonl") if e["event"] == "release"]
    assert releases and all(e["client"] == "trainer" for e in releases)
