"""Runs scripts/deploy_walkthrough.sh (the commands of docs/DEPLOY.md) end to end, so the
document stays true; then checks what each organization ended up holding, and that the
compose demo's mounts line up with the files the walkthrough creates."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

yaml = pytest.importorskip("yaml", reason="PyYAML parses docker/compose.yaml")


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("walkthrough")
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the venv's entry points
    env["PYTHON"] = sys.executable
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "deploy_walkthrough.sh"), str(work)],
        check=False, capture_output=True, text=True, timeout=400, cwd=REPO, env=env,
    )
    assert result.returncode == 0, f"walkthrough failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return work, result.stdout


def test_walkthrough_serves_and_the_trainer_connects(walkthrough):
    work, out = walkthrough
    for expected in (
        "listening on 127.0.0.1:",
        ": SERVING",  # the container health probe
        "connected to localhost:",
        "protocol target_feedback.v1",
        'target_owner_rpc_requests_total{rpc="GetInfo"} 1.0',
        "serve exited with status 0",
        "OK ",  # audit verify
        "walkthrough complete",
    ):
        assert expected in out, f"{expected!r} missing from the walkthrough output"
    assert "CANARY" not in (work / "owner" / "serve.log").read_text()


def test_only_ca_certificates_crossed_between_the_organizations(walkthrough):
    work, _ = walkthrough
    owner_files = {p.relative_to(work / "owner").as_posix() for p in (work / "owner").rglob("*") if p.is_file()}
    trainer_files = {p.relative_to(work / "trainer").as_posix() for p in (work / "trainer").rglob("*") if p.is_file()}
    assert {"node/tls/server.pem", "node/tls/server.key", "node/tls/trainer-ca.pem"} <= owner_files
    assert not any(name.startswith("node/pki/") for name in owner_files), "init's single-CA files removed"
    assert trainer_files == {
        "ca/ca.pem", "ca/ca.key", "tls/client.pem", "tls/client.key", "tls/owner-ca.pem", "feedback.toml",
    }
    owner_bytes = {(work / "owner" / n).read_bytes() for n in owner_files}
    trainer_bytes = {(work / "trainer" / n).read_bytes() for n in trainer_files}
    crossed = owner_bytes & trainer_bytes
    assert crossed == {(work / "owner/ca/ca.pem").read_bytes(), (work / "trainer/ca/ca.pem").read_bytes()}
    for key in [*(work / "owner").rglob("*.key"), *(work / "trainer").rglob("*.key")]:
        assert key.stat().st_mode & 0o777 == 0o600, key


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


def test_compose_mounts_match_the_walkthrough_layout(walkthrough, tmp_path):
    """The owner container sees a complete node at /srv/owner: every path in config.toml
    resolves to a mounted file, storage is the writable mount, health is probe-able."""
    from target_owner_node.config import load_config

    work, _ = walkthrough
    services = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())["services"]
    _container_view(services["owner"]["volumes"], work, tmp_path)
    config = load_config(tmp_path / "srv" / "owner" / "config.toml")
    for path in (config.data.heldout_path, config.data.test_path, config.tls.ca_cert, config.tls.server_cert,
                 config.tls.server_key):
        assert path.is_file() and path.is_relative_to(tmp_path / "srv" / "owner"), path
    assert config.storage.dir == tmp_path / "srv" / "owner" / "storage"
    assert config.server.health_address is not None
    assert "/srv/owner/config.toml" in (REPO / "docker" / "target-owner.Dockerfile").read_text()

    _container_view(services["trainer"]["volumes"], work, tmp_path)
    import tomllib

    feedback = tomllib.loads((work / "trainer" / "feedback.toml").read_text())["feedback"]
    for key in ("ca_cert", "client_cert", "client_key"):
        assert (tmp_path / "srv" / "trainer" / "tls" / Path(feedback[key]).name).is_file()


def _toml_block_after(text: str, marker: str) -> str:
    start = text.index(marker)
    block = text.index("```toml", start) + len("```toml")
    return text[block : text.index("```", block)]


def test_deploy_doc_matches_the_walkthrough_and_its_configs_validate(walkthrough, tmp_path):
    """docs/DEPLOY.md's numbered steps are the script's, and its config snippets are valid."""
    import re
    import tomllib

    from target_owner_node.config import parse_config

    doc = (REPO / "docs" / "DEPLOY.md").read_text()
    script = (REPO / "scripts" / "deploy_walkthrough.sh").read_text()
    doc_steps = [int(n) for n in re.findall(r"^\*\*(\d+)\. ", doc, re.MULTILINE)]
    script_steps = [int(n) for n in re.findall(r'^step "(\d+)\. ', script, re.MULTILINE)]
    assert doc_steps == script_steps == list(range(1, 13))
    for command in ("certs init-ca", "certs issue", "certs show", "target-owner-node init",
                    "target-owner-node serve", "target_owner_node.healthcheck", "audit verify"):
        assert command in doc and command in script, command

    owner = tomllib.loads(_toml_block_after(doc, "**6. Owner"))
    owner["storage"] = {"dir": "storage"}
    config = parse_config(owner, tmp_path)
    assert config.tls.ca_cert == tmp_path / "tls" / "trainer-ca.pem" and config.metrics.port == 9464

    feedback = tomllib.loads(_toml_block_after(doc, "**7. Trainer"))["feedback"]
    assert set(feedback) == {"target", "ca_cert", "client_cert", "client_key", "server_name"}
    work, _ = walkthrough
    assert set(feedback) == set(tomllib.loads((work / "trainer" / "feedback.toml").read_text())["feedback"])
