"""Shared pieces of the deployment tests: two organizations' PKI made with
`feedback-protocol certs`, canary-laden held-out data, owner configs and a served node
(in-process or as a `target-owner-node serve` subprocess), and a trainer-side client."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from protocol.certs_cli import init_ca, issue
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.io import write_examples

HELDOUT_SIZE = 110
REPO = Path(__file__).resolve().parents[2]


def canary(i: int) -> str:
    return f"CANARYdeploy{i:04d}QZX"


def heldout_examples() -> list[Example]:
    """Rows whose prompt and answer each carry a unique canary (a leak shows up verbatim)."""
    return [
        Example(
            id=f"d{i}",
            prompt=f"{i % 5}+{i % 3}= {canary(i)}",
            answer=f"{i % 5 + i % 3} {canary(i)}",
            domain="add",
            verifier="exact_match",
        )
        for i in range(HELDOUT_SIZE)
    ]


@dataclass(frozen=True)
class TwoOrgs:
    """Files of each organization. Only the two ca.pem files were ever copied across."""

    owner_ca: Path  # owner org CA folder (ca.pem + ca.key)
    trainer_ca: Path  # trainer org CA folder
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @property
    def owner_ca_cert(self) -> Path:
        return self.owner_ca / "ca.pem"

    @property
    def trainer_ca_cert(self) -> Path:
        return self.trainer_ca / "ca.pem"


def make_two_orgs(root: Path, server_names: tuple[str, ...] = ("localhost", "127.0.0.1")) -> TwoOrgs:
    init_ca("owner-org", root / "owner" / "ca")
    init_ca("trainer-org", root / "trainer" / "ca")
    server_cert, server_key = issue(
        root / "owner" / "ca", "server", server_names[0], server_names[1:], root / "owner" / "tls"
    )
    client_cert, client_key = issue(root / "trainer" / "ca", "client", "trainer", [], root / "trainer" / "tls")
    return TwoOrgs(root / "owner" / "ca", root / "trainer" / "ca", server_cert, server_key, client_cert, client_key)


@pytest.fixture(scope="session")
def two_orgs(tmp_path_factory) -> TwoOrgs:
    return make_two_orgs(tmp_path_factory.mktemp("orgs"))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_examples(root / "heldout.jsonl", heldout_examples())
    return root


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from rlvr_core.models.tiny_policy import random_tiny_policy

    texts = [e.prompt for e in heldout_examples()[:20]] + ["0123456789+= Answer:"]
    return random_tiny_policy(tmp_path_factory.mktemp("ckpt") / "tiny", texts, seed=0)


def owner_config(
    storage: Path, data_dir: Path, orgs: TwoOrgs, listen: str = "127.0.0.1:0", **sections: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """An owner config mapping for the two-org setup: tls.ca_cert is the TRAINER org's CA."""
    raw: dict[str, dict[str, Any]] = {
        "data": {"heldout_path": str(data_dir / "heldout.jsonl"), "min_heldout_size": 100, "prompt_template": "{prompt}"},
        "evaluation": {"max_new_tokens": 8, "max_samples_per_prompt": 4, "max_candidates_per_query": 4},
        # q = 1 keeps start-up calibration and accounting cheap in tests.
        "privacy": {"epsilon_budget": 1.0, "delta": 1e-5, "planned_releases": 10, "sample_rate": 1.0},
        "tls": {
            "ca_cert": str(orgs.trainer_ca_cert),
            "server_cert": str(orgs.server_cert),
            "server_key": str(orgs.server_key),
        },
        "server": {"listen_address": listen, "drain_delay_s": 0.0, "shutdown_grace_s": 2.0},
        "storage": {"dir": str(storage)},
        "access": {"allowed_clients": ["trainer"]},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return raw


def write_toml(path: Path, raw: dict[str, dict[str, Any]]) -> Path:
    """Enough TOML for these configs (tables of strings, numbers, booleans, string lists)."""
    lines = []
    for section, values in raw.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def client_settings(orgs: TwoOrgs, target: str, **overrides: Any):
    """Trainer-side settings: trust the OWNER org's CA, present the trainer's certificate."""
    from trainer_node.feedback.client import ClientSettings

    values: dict[str, Any] = {
        "target": target,
        "ca_cert": orgs.owner_ca_cert,
        "client_cert": orgs.client_cert,
        "client_key": orgs.client_key,
        "max_attempts": 1,
        "deadline_s": 20,
    }
    values.update(overrides)
    return ClientSettings(**values)


def decoding(**overrides: Any):
    from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

    settings = {"max_new_tokens": 4, "samples_per_prompt": 1, "temperature": 0.0, "seed": 1, **overrides}
    return pb.DecodingSettings(**settings)


# -- a `target-owner-node serve` subprocess ------------------------------------------------------
class ServeProcess:
    """`target-owner-node serve` as a child process (optionally under a command prefix, e.g.
    `ip netns exec NS`). Logs go to a file; the port comes from the 'listening on' line."""

    def __init__(self, config_path: Path, log_path: Path, prefix: tuple[str, ...] = (), port: int | None = 0):
        command = [*prefix, sys.executable, "-m", "target_owner_node.cli", "serve", "--config", str(config_path)]
        if port is not None:
            command += ["--port", str(port)]
        self.log_path = log_path
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log_path.open("ab"),
            text=True,
            start_new_session=True,
            cwd=REPO,
        )
        line = self.process.stdout.readline()
        if not line.startswith("listening on "):
            self.kill()
            raise AssertionError(f"serve did not start: {line!r}; log tail: {self.log()[-3000:]}")
        self.port = int(line.rsplit(":", 1)[1])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


@contextlib.contextmanager
def serving(config_path: Path, log_path: Path, **kwargs: Any) -> Iterator[ServeProcess]:
    serve = ServeProcess(config_path, log_path, **kwargs)
    try:
        yield serve
    finally:
        serve.kill()


def wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class StubScorer:
    """In-process scorer without a model: every row scores `value`. `fail_next` raises once
    (e.g. an exception whose text quotes a held-out row, as a buggy verifier might)."""

    def __init__(self, value: float = 0.5) -> None:
        self.value = value
        self.fail_next: BaseException | None = None

    def score(self, split, checkpoints, indices, decoding):
        import numpy as np

        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        return np.full((len(checkpoints), len(indices)), self.value)

    def close(self) -> None:
        pass


@contextlib.contextmanager
def in_process_owner(raw: dict, base_dir: Path, scorer: Any = None) -> Iterator[Any]:
    """start_server on the config mapping `raw`; yields the RunningServer."""
    from target_owner_node.config import parse_config
    from target_owner_node.server import start_server

    running = start_server(parse_config(raw, base_dir), scorer=scorer or StubScorer())
    try:
        yield running
    finally:
        running.shutdown(grace_s=0, drain_delay_s=0)
