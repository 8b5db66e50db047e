"""README.md's and docs/DEPLOY.md's "Your own model and data" sections, run as written.

The commands are extracted from the markdown (every ```bash block of the section), so the
documents and this test cannot drift. The README's run in an empty folder: a model folder, a
prompt file, a verifier package installed with pip, a run config, `trainer-node train`. DEPLOY.md's
continues it against an owner configured with its `[data]` snippet (the same verifier, a chatml
rendering), using step 7's `[feedback]` section: `check-owner`, then `train` with feedback.

pip runs as written; the environment points it at a scratch folder (PIP_TARGET) and keeps it
offline (no index, no build isolation), so nothing is installed into the project's venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Your own model and data"


def section(path: Path) -> str:
    text = path.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else None]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


def run_commands(script: str, cwd: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update({
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "PIP_TARGET": str(site), "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    })
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def org(tmp_path_factory) -> tuple[Path, Path]:
    """The README's commands, run in an empty folder (the trainer organization's)."""
    root = tmp_path_factory.mktemp("org")
    folder, site = root / "trainer", root / "site"
    folder.mkdir()
    site.mkdir()
    commands = blocks(section(REPO / "README.md"), "bash")
    assert commands, "README.md's section has its commands in ```bash blocks"
    result = run_commands("\n".join(commands), folder, site)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return folder, site


def test_the_readme_section_runs_as_written(org):
    folder, site = org
    summary = json.loads((folder / "runs" / "my-run" / "summary.json").read_text())
    assert summary["steps"] == 2
    resolved = json.loads((folder / "runs" / "my-run" / "resolved_config.json").read_text())
    assert resolved["data"]["prompts"]["verifier"] == "last_number"
    assert resolved["model"]["path"] == str(folder / "my-model")
    assert (site / "my_verifiers").is_dir(), "pip installed the verifier package into the scratch site"


def test_the_deploy_section_runs_against_an_owner_as_written(org, tmp_path, monkeypatch):
    from rlvr_core.tasks.io import write_examples
    from target_owner_node import logs
    from target_owner_node.config import parse_config
    from target_owner_node.server import start_server
    from tests.deploy.conftest import heldout_examples, make_two_orgs, owner_config
    from tests.plugin_install import verifiers_from

    folder, site = org
    doc = section(REPO / "docs" / "DEPLOY.md")
    owner_data = tomllib.loads(blocks(doc, "toml")[0])["data"]
    assert owner_data["verifier"] == "last_number" and owner_data["chat_format"] == "chatml"
    orgs = make_two_orgs(tmp_path / "orgs")
    write_examples(tmp_path / "heldout.jsonl", heldout_examples())
    owner_data["heldout_path"] = str(tmp_path / "heldout.jsonl")  # the owner's own file
    raw = owner_config(tmp_path / "storage", tmp_path, orgs, data=owner_data, evaluation={"timeout_s": 300})

    # Step 7's [feedback] section, addressed at this owner, with its tls/ files beside it.
    step7 = (REPO / "docs" / "DEPLOY.md").read_text().split("**7. Trainer")[1]
    feedback = blocks(step7, "toml")[0]
    tls = folder / "tls"
    tls.mkdir(exist_ok=True)
    shutil.copy(orgs.owner_ca_cert, tls / "owner-ca.pem")
    shutil.copy(orgs.client_cert, tls / "client.pem")
    shutil.copy(orgs.client_key, tls / "client.key")

    logs.configure(enabled=False)
    with verifiers_from(site, monkeypatch):  # the owner's verifier is the same package (its worker inherits sys.path)
        running = start_server(parse_config(raw, tmp_path))
        try:
            (folder / "feedback.toml").write_text(
                feedback.replace("owner.example.org:50051", f"localhost:{running.port}")
                .replace('server_name = "owner.example.org"', 'server_name = "localhost"'))
            result = run_commands("\n".join(blocks(doc, "bash")), folder, site)
        finally:
            running.shutdown(grace_s=0, drain_delay_s=0)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "connected to localhost:" in result.stdout and "verifier last_number" in result.stdout
    summary = json.loads((folder / "runs" / "my-run" / "summary.json").read_text())
    assert summary["feedback_queries"] >= 1 and summary["feedback_failures"] == 0
    assert "chat format 'chatml'" in summary["rendering"], "the trainer rendered as the owner publishes"
