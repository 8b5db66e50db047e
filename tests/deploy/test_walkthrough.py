"""Runs scripts/deploy_walkthrough.sh (the commands of docs/DEPLOY.md) so the document stays true.

The full walkthrough (serve, check-owner, train with L2RR against the owner, metrics, stop and audit)
takes about a minute on a shared 2-core machine, so it is marked slow (`pytest -m slow`); its
`--setup-only` half (certificates and configs, what docker/prepare-demo.sh runs) runs by default and
checks what each organization ended up holding, that the compose demo's mounts line up with the files
it creates, and that DEPLOY.md's steps and snippets are the script's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

yaml = pytest.importorskip("yaml", reason="PyYAML parses docker/compose.yaml")
OUTPUTS = ("runs/",)  # the trainer's run outputs and tiny-policy cache (docker/compose.yaml's writable mount)


def _run(work: Path, *args: str, env: dict | None = None) -> str:
    environment = dict(os.environ)
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"  # the venv's entry points
    environment["PYTHON"] = sys.executable
    environment.update(env or {})
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "deploy_walkthrough.sh"), *args, str(work)],
        check=False, capture_output=True, text=True, timeout=600, cwd=REPO, env=environment,
    )
    assert result.returncode == 0, f"walkthrough failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def setup_only(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("walkthrough-setup")
    _run(work, "--setup-only")
    return work


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("walkthrough")
    return work, _run(work)


@pytest.mark.slow
def test_walkthrough_serves_trains_with_l2rr_and_audits(walkthrough):
    work, out = walkthrough
    for expected in (
        "listening on 127.0.0.1:",
        ": SERVING",  # the container health probe
        "connected to localhost:",  # check-owner
        "protocol target_feedback.v1",
        "trained with feedback:",
        "(0 failed)",
        'target_owner_rpc_requests_total{rpc="Evaluate"}',
        "serve exited with status 0",
        "OK ",  # audit verify
        "walkthrough complete",
    ):
        assert expected in out, f"{expected!r} missing from the walkthrough output"
    queries = int(out.split("trained with feedback: ")[1].split(" queries")[0])
    assert queries >= 2, "L2RR queried the owner during training (beside the final release)"
    assert "CANARY" not in (work / "owner" / "serve.log").read_text()


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and not p.relative_to(root).as_posix().startswith(OUTPUTS)}


def test_only_ca_certificates_crossed_between_the_organizations(setup_only):
    work = setup_only
    owner_files, trainer_files = _files(work / "owner"), _files(work / "trainer")
    assert {"node/tls/server.pem", "node/tls/server.key", "node/tls/trainer-ca.pem"} <= owner_files
    assert not any(name.startswith("node/pki/") for name in owner_files), "init's single-CA files removed"
    assert trainer_files == {
        "ca/ca.pem", "ca/ca.key", "tls/client.pem", "tls/client.key", "tls/owner-ca.pem", "feedback.toml", "train.toml",
    }
    owner_bytes = {(work / "owner" / n).read_bytes() for n in owner_files}
    trainer_bytes = {(work / "trainer" / n).read_bytes() for n in trainer_files}
    crossed = owner_bytes & trainer_bytes
    assert crossed == {(work / "owner/ca/ca.pem").read_bytes(), (work / "trainer/ca/ca.pem").read_bytes()}
    for key in [*(work / "owner").rglob("*.key"), *(work / "trainer").rglob("*.key")]:
        assert key.stat().st_mode & 0o777 == 0o600, key


def test_the_trainer_run_config_is_l2rr_with_feedback_and_validates(setup_only):
    from trainer_node.config import load_config

    config = load_config(setup_only / "trainer" / "train.toml")
    assert config.policy.name == "l2rr" and config.feedback is not None and config.feedback.required
    assert config.feedback.ca_cert == setup_only / "trainer" / "tls" / "owner-ca.pem"  # beside the config
    assert config.run.device == "cpu"


def _container_view(volumes: list[str], work: Path, root: Path) -> None:
    """Copy each `./demo/<path>:<target>` mount of compose.yaml into root/<target>."""
    for volume in volumes:
        source, target = volume.split(":")[:2]
        if not source.startswith("./demo/"):
            continue
        host = work / source.removeprefix("./demo/")
        destination = root / target.lstrip("/")
        destination.parent.mkdir(parents=True, exist_ok=True)
        if host.is_dir():
            shutil.copytree(host, destination)
        elif host.exists():
            shutil.copy2(host, destination)


def test_compose_mounts_match_the_walkthrough_layout(setup_only, tmp_path):
    """The owner container sees a complete node at /srv/owner: every path in config.toml
    resolves to a mounted file, storage is the writable mount, health is probe-able; the trainer
    container sees its run config with the [feedback] files beside it."""
    from target_owner_node.config import load_config
    from trainer_node.config import load_config as load_run_config

    work = setup_only
    services = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())["services"]
    _container_view(services["owner"]["volumes"], work, tmp_path)
    config = load_config(tmp_path / "srv" / "owner" / "config.toml")
    for path in (config.data.heldout_path, config.data.test_path, config.tls.ca_cert, config.tls.server_cert,
                 config.tls.server_key):
        assert path.is_file() and path.is_relative_to(tmp_path / "srv" / "owner"), path
    assert config.storage.dir == tmp_path / "srv" / "owner" / "storage"
    assert config.server.health_address is not None
    assert "/srv/owner/config.toml" in (REPO / "docker" / "target-owner.Dockerfile").read_text()

    (work / "trainer" / "runs").mkdir(exist_ok=True)
    _container_view(services["trainer"]["volumes"], work, tmp_path)
    run = load_run_config(tmp_path / "srv" / "trainer" / "train.toml")
    for path in (run.feedback.ca_cert, run.feedback.client_cert, run.feedback.client_key):
        assert path.is_file() and path.is_relative_to(tmp_path / "srv" / "trainer" / "tls"), path


def _toml_block_after(text: str, marker: str) -> str:
    start = text.index(marker)
    block = text.index("```toml", start) + len("```toml")
    return text[block : text.index("```", block)]


def test_deploy_doc_matches_the_walkthrough_and_its_configs_validate(setup_only, tmp_path):
    """docs/DEPLOY.md's numbered steps are the script's, and its config snippets are valid."""
    import re
    import tomllib

    from target_owner_node.config import parse_config

    doc = (REPO / "docs" / "DEPLOY.md").read_text()
    script = (REPO / "scripts" / "deploy_walkthrough.sh").read_text()
    doc_steps = [int(n) for n in re.findall(r"^\*\*(\d+)\. ", doc, re.MULTILINE)]
    script_steps = [int(n) for n in re.findall(r'^step "(\d+)\. ', script, re.MULTILINE)]
    assert doc_steps == script_steps == list(range(1, 14))
    for command in ("certs init-ca", "certs issue", "certs show", "target-owner-node init",
                    "target-owner-node serve", "target_owner_node.healthcheck", "trainer-node check-owner",
                    "trainer-node train", "audit verify"):
        assert command in doc and command in script, command

    owner = tomllib.loads(_toml_block_after(doc, "**6. Owner"))
    owner["storage"] = {"dir": "storage"}
    config = parse_config(owner, tmp_path)
    assert config.tls.ca_cert == tmp_path / "tls" / "trainer-ca.pem" and config.metrics.port == 9464

    feedback = tomllib.loads(_toml_block_after(doc, "**7. Trainer"))["feedback"]
    assert set(feedback) == {"target", "ca_cert", "client_cert", "client_key", "server_name"}
    assert set(feedback) == set(tomllib.loads((setup_only / "trainer" / "feedback.toml").read_text())["feedback"])
