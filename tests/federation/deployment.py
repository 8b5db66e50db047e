"""A real Flower deployment on loopback, started the way docs/FLOWER.md ("A deployment") says:

- the SuperLink: `flower-superlink` with TLS (a certificate from `feedback-protocol certs`),
  SuperNode authentication on (`--enable-supernode-auth`) and runtime dependency installation off;
- each owner: an ECDSA node key (`ssh-keygen`), registered by the SuperLink's operator with
  `flwr supernode register` (which prints the node id the run pins the owner to), and a
  `flower-supernode` whose `--node-config` names its own `target-owner-node serve` (address and the
  trainer's client certificate: paths only);
- the trainer: `flwr run flower-app <superlink> --stream --run-config ...`.

Every process is started here in its own session and stopped here by its id (its process group:
the SuperLink's and SuperNodes' own children, the superexec and app processes, go with it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "flower-app"
BIN = Path(sys.executable).parent


def flower_env(home: Path) -> dict[str, str]:
    return {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),  # the SuperLink starts flower-superexec
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class OwnerSite:
    """What one owner's SuperNode is started with: its owner node and the trainer's client certificate."""

    name: str
    address: str
    ca: Path      # the owner node's CA (verifies its server certificate)
    cert: Path    # the trainer's client certificate and key, which the owner node authorizes
    key: Path

    @classmethod
    def of_owner_folder(cls, name: str, address: str, pki: Path) -> OwnerSite:
        """An owner folder written by `target-owner-node init` (pki/: ca.pem, client.pem, client.key)."""
        return cls(name, address, pki / "ca.pem", pki / "client.pem", pki / "client.key")

    def node_config_values(self) -> dict[str, str]:
        """What the SuperNode's --node-config parses to (flower_shim.app.settings_from_node_config reads it)."""
        return {"owner-name": self.name, "owner-address": self.address, "owner-ca": str(self.ca),
                "owner-cert": str(self.cert), "owner-key": str(self.key), "owner-server-name": "localhost"}

    def node_config(self) -> str:
        return " ".join(f'{key}="{value}"' for key, value in self.node_config_values().items())


@dataclass
class LocalDeployment:
    root: Path
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    node_ids: dict[str, int] = field(default_factory=dict)

    @property
    def tls(self) -> Path:
        return self.root / "superlink-tls"

    @property
    def cli_home(self) -> Path:
        return self.root / "trainer-flwr-home"

    def _spawn(self, name: str, argv: list[str], home: Path) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(argv, env=flower_env(home), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=self.root)
        self.processes[name] = process
        return process

    def _cli(self, *args: str, timeout: float = 120.0) -> str:
        done = subprocess.run([str(BIN / "flwr"), *args], check=False, env=flower_env(self.cli_home), capture_output=True,
                              text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} failed ({done.returncode}): {done.stdout[-2000:]}"
                               f"{done.stderr[-2000:]}")
        return done.stdout

    def start_superlink(self) -> None:
        """TLS from the project's own certificate tool; the trainer's CLI trusts its CA."""
        subprocess.run([sys.executable, "-m", "protocol.cli", "certs", "init-ca", "--org", "link", "--out",
                        str(self.tls)], check=True, env=flower_env(self.root), capture_output=True)
        subprocess.run([sys.executable, "-m", "protocol.cli", "certs", "issue", "--ca", str(self.tls), "--usage",
                        "server", "--name", "localhost", "--san", "127.0.0.1", "--out", str(self.tls)],
                       check=True, env=flower_env(self.root), capture_output=True)
        self.cli_home.mkdir(parents=True, exist_ok=True)
        (self.cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{self.port}"\n'
            f'root-certificates = "{self.tls / "ca.pem"}"\n')
        self._spawn("superlink", [str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(self.tls / "ca.pem"),
                                  "--ssl-certfile", str(self.tls / "server.pem"), "--ssl-keyfile",
                                  str(self.tls / "server.key"), "--enable-supernode-auth", "--host", "127.0.0.1",
                                  "--port", str(self.port), "--disable-runtime-dependency-installation"],
                    self.root / "superlink-home")
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.processes["superlink"].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the SuperLink did not start: {self.log('superlink')[-3000:]}") from None
                time.sleep(0.3)

    def add_owner(self, site: OwnerSite) -> int:
        """The owner's node key, registered by the SuperLink's operator; then its SuperNode."""
        key = self.root / f"{site.name}-node-key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(key), "-C", site.name],
                       check=True, capture_output=True)
        registered = json.loads(self._cli("supernode", "register", f"{key}.pub", "local", "--name", site.name,
                                          "--format", "json"))
        node_id = int(registered["node-id"] if "node-id" in registered else registered["node_id"])
        self.node_ids[site.name] = node_id
        self._spawn(f"supernode-{site.name}",
                    [str(BIN / "flower-supernode"), "--superlink", f"127.0.0.1:{self.port}", "--root-certificates",
                     str(self.tls / "ca.pem"), "--auth-supernode-private-key", str(key), "--port", str(free_port()),
                     "--node-config", site.node_config()], self.root / f"{site.name}-flwr-home")
        return node_id

    def run(self, run_config: dict[str, object], timeout: float = 600.0) -> subprocess.CompletedProcess:
        """`flwr run flower-app local --stream`: returns when the run has ended."""
        overrides = " ".join(f"{key}={json.dumps(value)}" for key, value in run_config.items())
        return subprocess.run([str(BIN / "flwr"), "run", str(APP), "local", "--stream", "--run-config", overrides], check=False,
                              env=flower_env(self.cli_home), capture_output=True, text=True, timeout=timeout,
                              cwd=self.root)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            signal_group(process, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            signal_group(process, signal.SIGKILL)  # what the group's leader left behind (superexec, apps)
            process.wait(timeout=5)


def signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)  # the session started for this process: its id is the group's
    except ProcessLookupError:
        pass
