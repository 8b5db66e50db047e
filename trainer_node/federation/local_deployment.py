"""A real Flower deployment on one machine (a rehearsal; scripts/flower_deployment.sh and the slow tests).

Every party plays its part through its own commands, as docs/FLOWER.md ("A deployment") says:

- each owner: `target-owner-node init` + `target-owner-node serve` (its data, noise, ledger), an ECDSA
  node key (`ssh-keygen`) and a `flower-supernode` whose `--node-config` names that node (address and
  the trainer's client certificate: paths only);
- the SuperLink's operator: `flower-superlink` with TLS (a certificate from `feedback-protocol certs`),
  SuperNode authentication on and runtime dependency installation off, and `flwr supernode register`
  of each owner's public key (which fixes the node id the run pins the owner to);
- the trainer: `flwr run flower-app <superlink> --stream --run-config ...`.

Nothing is imported from either party: the owners run as their own processes. Every process is
started in its own session and its id is kept in WORKDIR/deployment.json, so `down` (from another
process, later) stops each one by its process group: the SuperLink's and SuperNodes' children, the
superexec and app processes, go with it.

    python -m trainer_node.federation.local_deployment up WORKDIR [--owners 2] [--testbed default]
    python -m trainer_node.federation.local_deployment run WORKDIR [--train-config F] [--steps N]
    python -m trainer_node.federation.local_deployment stop-supernode WORKDIR OWNER   # an owner's outage
    python -m trainer_node.federation.local_deployment down WORKDIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
STATE_FILE = "deployment.json"
LISTENING = re.compile(r"listening on (\S+):(\d+)")


def flower_env(home: Path) -> dict[str, str]:
    return {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "PYTHONUNBUFFERED": "1",
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


class DeploymentError(RuntimeError):
    """A piece of the deployment did not start, or WORKDIR holds no deployment; the text says which."""


@dataclass
class LocalDeployment:
    root: Path
    port: int = field(default_factory=free_port)
    pids: dict[str, int] = field(default_factory=dict)        # process name -> id (its group's id too)
    node_ids: dict[str, int] = field(default_factory=dict)    # owner -> the node id its key is registered under
    testbed: str = "default"                                  # where the owners' held-out data came from
    children: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)  # started by this process

    @property
    def tls(self) -> Path:
        return self.root / "superlink-tls"

    @property
    def cli_home(self) -> Path:
        return self.root / "trainer-flwr-home"

    # --- state, so that another process can run and stop what `up` started ----------------

    def save(self) -> None:
        state = {"port": self.port, "pids": self.pids, "node_ids": self.node_ids, "testbed": self.testbed}
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, root: Path) -> LocalDeployment:
        path = Path(root) / STATE_FILE
        if not path.exists():
            raise DeploymentError(f"{root}: no {STATE_FILE} (start the deployment with `up {root}` first)")
        state = json.loads(path.read_text())
        return cls(Path(root), int(state["port"]), {k: int(v) for k, v in state["pids"].items()},
                   {k: int(v) for k, v in state["node_ids"].items()}, str(state.get("testbed", "default")))

    # --- the pieces -------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], home: Path) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{name}.log", "wb") as log:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(argv, env=flower_env(home), stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, cwd=self.root)
        self.pids[name] = process.pid
        self.children[name] = process
        self.save()
        return process

    def _cli(self, *args: str, timeout: float = 120.0) -> str:
        done = subprocess.run([str(BIN / "flwr"), *args], check=False, env=flower_env(self.cli_home), capture_output=True,
                              text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            raise DeploymentError(f"flwr {' '.join(args)} failed ({done.returncode}): {done.stdout[-2000:]}"
                                  f"{done.stderr[-2000:]}")
        return done.stdout

    def start_owner_node(self, name: str, testbed: str, init_args: tuple[str, ...] = (),
                         timeout: float = 180.0) -> OwnerSite:
        """An owner's own node: `target-owner-node init` (config, PKI, held-out data) and `serve` on a free
        loopback port. Its SuperNode gets the trainer's client certificate that init issued."""
        folder = self.root / "owners" / name
        done = subprocess.run([str(BIN / "target-owner-node"), "init", str(folder), "--testbed", testbed, *init_args],
                              check=False, capture_output=True, text=True, env=flower_env(self.root))
        if done.returncode != 0:
            raise DeploymentError(f"target-owner-node init {folder} failed: {done.stderr[-2000:]}")
        process = self._spawn(f"owner-{name}", [str(BIN / "target-owner-node"), "serve", "--config",
                                                str(folder / "config.toml"), "--port", "0"], folder / "flwr-home")
        deadline = time.monotonic() + timeout
        while not (match := LISTENING.search(self.log(f"owner-{name}"))):
            if process.poll() is not None or time.monotonic() > deadline:
                raise DeploymentError(f"target-owner-node serve ({name}) did not start: "
                                      f"{self.log(f'owner-{name}')[-3000:]}")
            time.sleep(0.3)
        return OwnerSite.of_owner_folder(name, f"127.0.0.1:{match.group(2)}", folder / "pki")

    def start_superlink(self) -> None:
        """TLS from the project's own certificate tool; the trainer's CLI trusts its CA."""
        for args in (["init-ca", "--org", "link", "--out", str(self.tls)],
                     ["issue", "--ca", str(self.tls), "--usage", "server", "--name", "localhost", "--san", "127.0.0.1",
                      "--out", str(self.tls)]):
            subprocess.run([sys.executable, "-m", "protocol.cli", "certs", *args], check=True, env=flower_env(self.root),
                           capture_output=True)
        self.cli_home.mkdir(parents=True, exist_ok=True)
        (self.cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{self.port}"\n'
            f'root-certificates = "{self.tls / "ca.pem"}"\n')
        process = self._spawn("superlink", [
            str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(self.tls / "ca.pem"), "--ssl-certfile",
            str(self.tls / "server.pem"), "--ssl-keyfile", str(self.tls / "server.key"), "--enable-supernode-auth",
            "--host", "127.0.0.1", "--port", str(self.port), "--disable-runtime-dependency-installation"],
            self.root / "superlink-home")
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise DeploymentError(f"the SuperLink did not start: {self.log('superlink')[-3000:]}") from None
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
        self._spawn(self.supernode(site.name),
                    [str(BIN / "flower-supernode"), "--superlink", f"127.0.0.1:{self.port}", "--root-certificates",
                     str(self.tls / "ca.pem"), "--auth-supernode-private-key", str(key), "--port", str(free_port()),
                     "--node-config", site.node_config()], self.root / f"{site.name}-flwr-home")
        return node_id

    @staticmethod
    def supernode(owner: str) -> str:
        return f"supernode-{owner}"

    def run_argv(self, run_config: dict[str, object]) -> list[str]:
        """`flwr run flower-app local --stream`, the owners and their registered node ids filled in."""
        config = {"owners": ",".join(self.node_ids),
                  "owner-nodes": ",".join(f"{name}={node}" for name, node in self.node_ids.items()), **run_config}
        overrides = " ".join(f"{key}={json.dumps(value)}" for key, value in config.items())
        return [str(BIN / "flwr"), "run", str(APP), "local", "--stream", "--run-config", overrides]

    def run(self, run_config: dict[str, object], timeout: float = 600.0) -> subprocess.CompletedProcess:
        """The trainer's run; returns when it has ended."""
        return subprocess.run(self.run_argv(run_config), check=False, env=flower_env(self.cli_home),
                              capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, name: str) -> None:
        """SIGKILL one piece and its children (an outage: no goodbye to the SuperLink)."""
        if name not in self.pids:
            raise DeploymentError(f"no process {name!r} in this deployment; it has {', '.join(self.pids)}")
        stop_group(self.pids[name], self.children.get(name), grace_s=0.0)

    def stop(self) -> None:
        """The trainer's side first, the owners' nodes last (they drain in-flight calls on SIGTERM)."""
        for name in reversed(list(self.pids)):
            stop_group(self.pids[name], self.children.get(name))


def alive(pid: int, child: subprocess.Popen | None) -> bool:
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose (its parent, or init, reaps it)
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def stop_group(pid: int, child: subprocess.Popen | None = None, grace_s: float = 15.0) -> None:
    """SIGTERM to the process group `pid` leads (each piece was started in its own session), up to
    `grace_s` for it to exit, then SIGKILL to what the group's leader left behind (superexec, apps)."""
    if grace_s > 0:
        signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while alive(pid, child) and time.monotonic() < deadline:
            time.sleep(0.2)
    signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(pid, child) and time.monotonic() < deadline:  # SIGKILL is delivered, not awaited
        time.sleep(0.1)


def signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


# --- the command line (scripts/flower_deployment.sh) ------------------------------------------

def default_train_config(workdir: Path, testbed: str, steps: int) -> Path:
    """A `train` config without [feedback] (the owners are the run's SuperNodes): L2RR on the tiny
    policy of the testbed, cached where `simulate` caches it when run from the same folder."""
    path = workdir / "train.toml"
    path.write_text(f"""# written by trainer_node/federation/local_deployment.py: edit it, or pass --train-config
[model]
tiny = true
cache_dir = {json.dumps(str(Path.cwd() / '.cache' / 'tiny_policies'))}
[data]
testbed = {json.dumps(testbed)}
eval_size = 16
[policy]
name = "l2rr"
max_staleness = 0
[run]
steps = {steps}
out_dir = {json.dumps(str(workdir / 'run'))}
device = "cpu"
""")
    return path


def up(args: argparse.Namespace) -> int:
    root = Path(args.workdir).resolve()
    if (root / STATE_FILE).exists():
        raise DeploymentError(f"{root}: a deployment is already there ({STATE_FILE}); `down {root}` first")
    root.mkdir(parents=True, exist_ok=True)
    testbed = str(Path(args.testbed).resolve()) if Path(args.testbed).is_file() else args.testbed  # a name, or a file
    deployment = LocalDeployment(root, testbed=testbed)
    init_args = tuple(args.init_arg or ())
    try:
        sites = [deployment.start_owner_node(f"owner{i}", testbed, init_args) for i in range(args.owners)]
        deployment.start_superlink()
        for site in sites:
            deployment.add_owner(site)
    except BaseException:
        deployment.stop()
        raise
    deployment.save()
    for site in sites:
        print(f"{site.name}: target-owner-node serve on {site.address}, SuperNode node id {deployment.node_ids[site.name]}")
    print(f"SuperLink on 127.0.0.1:{deployment.port} (TLS, SuperNode authentication); logs and state in {root}")
    return 0


def run(args: argparse.Namespace) -> int:
    root = Path(args.workdir).resolve()
    deployment = LocalDeployment.load(root)
    config = (Path(args.train_config).resolve() if args.train_config
              else default_train_config(root, deployment.testbed, args.steps or 10))
    out_dir = Path(args.out_dir).resolve() if args.out_dir else root / "run"
    run_config: dict[str, object] = {"train-config": str(config), "out-dir": str(out_dir),
                                     "startup-timeout": float(args.startup_timeout),
                                     "message-timeout": float(args.message_timeout)}
    if args.steps and args.train_config:
        run_config["steps"] = int(args.steps)
    done = subprocess.run(deployment.run_argv(run_config), check=False, env=flower_env(deployment.cli_home), cwd=root)
    summary_path = out_dir / "summary.json"
    if not summary_path.exists():
        print(f"the run wrote no {summary_path} (flwr run exited {done.returncode}; see {root}/superlink.log)",
              file=sys.stderr)
        return done.returncode or 1
    summary = json.loads(summary_path.read_text())
    print(f"\nflower deployment: {summary.get('steps')} steps, {len(summary['owners'])} owners "
          f"({summary.get('aggregation')}), summary in {summary_path}")
    for name, owner in summary["owners"].items():
        lost = "" if owner.get("lost_step") is None else f"  LOST at step {owner['lost_step']}: {owner['lost_reason']}"
        print(f"  {name}: {owner['queries']} queries, epsilon spent {owner.get('epsilon_spent', 0.0):.3f}, "
              f"upload bytes {summary.get('upload_bytes', {}).get(name)}{lost}")
    return done.returncode


def stop_supernode(args: argparse.Namespace) -> int:
    deployment = LocalDeployment.load(Path(args.workdir).resolve())
    deployment.kill(LocalDeployment.supernode(args.owner))
    print(f"killed {args.owner}'s SuperNode (SIGKILL; its owner node still serves)")
    return 0


def down(args: argparse.Namespace) -> int:
    root = Path(args.workdir).resolve()
    LocalDeployment.load(root).stop()
    (root / STATE_FILE).unlink()
    print(f"stopped every process of the deployment in {root}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flower_deployment", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start the owners' nodes, the SuperLink and one SuperNode per owner")
    start.set_defaults(handler=up)
    start.add_argument("workdir")
    start.add_argument("--owners", type=int, default=2, help="how many owners (default 2)")
    start.add_argument("--testbed", default="default", help="the testbed every owner's held-out data comes from")
    start.add_argument("--init-arg", action="append", metavar="ARG",
                       help="passed to each `target-owner-node init` (repeat: --init-arg=--epsilon --init-arg=8)")
    go = commands.add_parser("run", help="flwr run: the trainer's ServerApp with the owners behind the SuperLink")
    go.set_defaults(handler=run)
    go.add_argument("workdir")
    go.add_argument("--train-config", help="a `train` config without [feedback] (default: L2RR on the tiny policy)")
    go.add_argument("--steps", type=int, help="training steps (default: the config's; 10 for the default config)")
    go.add_argument("--out-dir", help="the run's folder (default WORKDIR/run)")
    go.add_argument("--startup-timeout", type=float, default=120.0, help="seconds to wait for the SuperNodes")
    go.add_argument("--message-timeout", type=float, default=300.0, help="seconds one message may take")
    kill = commands.add_parser("stop-supernode", help="SIGKILL one owner's SuperNode (rehearse an outage)")
    kill.set_defaults(handler=stop_supernode)
    kill.add_argument("workdir")
    kill.add_argument("owner")
    stop = commands.add_parser("down", help="stop every process `up` started")
    stop.set_defaults(handler=down)
    stop.add_argument("workdir")
    args = parser.parse_args(argv)
    if args.command == "up" and args.owners < 1:
        parser.error(f"--owners: at least 1 owner, got {args.owners}")
    try:
        return args.handler(args)
    except DeploymentError as error:
        print(f"flower_deployment {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DeploymentError", "LocalDeployment", "OwnerSite"]
