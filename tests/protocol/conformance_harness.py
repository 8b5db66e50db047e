"""Test harness for the conformance suite: owner node folders made with `target-owner-node
init` (small testbed, canaries planted), and the owner server run as a real subprocess.

Run as a script it is also the suite's --restart-cmd:

    python tests/protocol/conformance_harness.py start   --dir NODE --port P
    python tests/protocol/conformance_harness.py restart --dir NODE --port P
    python tests/protocol/conformance_harness.py stop    --dir NODE

and a test-only --launch-cmd: the real server, in the foreground, on the suite's held-out file,
with one of broken_servers.LAUNCH_BREAKAGES applied (`launch_command(kind)` gives the template):

    python tests/protocol/conformance_harness.py launch --break KIND --heldout F --port P \
        --workdir DIR --ca F --cert F --key F [--no-dp] [--sample-rate Q] [--epsilon E] [--planned-releases N]

The server is started from this short-lived script, so it is not a child of the test process
(its exit is reaped by init and "is it gone?" can be answered from /proc). Its pid is kept in
NODE/server.pid and its output in NODE/server.log.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CANARIES = ["CANARY-7f3a91-heldout-prompt", "CANARY-c0ffee42-heldout-answer", "CANARY-d15ea5e-third-row"]


@dataclass(frozen=True)
class NodeSetup:
    dir: Path
    config_path: Path
    ca: Path
    cert: Path
    key: Path
    ca_key: Path
    canaries_file: Path
    canaries: tuple[str, ...]


def make_node(directory: Path, canaries: list[str] = CANARIES) -> NodeSetup:
    """`target-owner-node init DIR --testbed small` with canaries planted in heldout.jsonl."""
    from target_owner_node.scaffold import init_node

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    init_node(directory, testbed="small", canaries=list(canaries))
    (directory / "canaries.txt").write_text("\n".join(canaries) + "\n")
    return node_setup(directory)


_BASE_NODES: dict[str, Path] = {}


def base_node(tmp_path_factory) -> Path:
    """One init'ed node folder per test session, shared by the conformance test modules (init
    builds the testbed and a PKI: seconds); tests copy it with `copy_node`."""
    key = str(tmp_path_factory.getbasetemp())
    if key not in _BASE_NODES:
        _BASE_NODES[key] = make_node(tmp_path_factory.mktemp("conformance-base") / "node").dir
    return _BASE_NODES[key]


def node_setup(directory: Path) -> NodeSetup:
    pki = directory / "pki"
    canaries_file = directory / "canaries.txt"
    return NodeSetup(directory, directory / "config.toml", pki / "ca.pem", pki / "client.pem", pki / "client.key",
                     pki / "ca.key", canaries_file,
                     tuple(line.strip() for line in canaries_file.read_text().splitlines() if line.strip()))


def copy_node(source: Path, directory: Path, **settings: object) -> NodeSetup:
    """A copy of a node folder (fresh storage) with config settings overridden, e.g.
    planned_releases=60 (see `configure`)."""
    source = Path(source)

    def runtime_files(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if Path(folder) == source and n in ("storage", "server.pid", "server.log")]

    shutil.copytree(source, directory, ignore=runtime_files)
    (directory / "storage").mkdir()
    configure(directory / "config.toml", **settings)
    return node_setup(directory)


def configure(config_path: Path, **settings: object) -> None:
    """Override `key = value` lines of a config written by init (keys are unique across
    its sections); shutdown is always made quick for tests."""
    text = config_path.read_text()
    for key, value in {"drain_delay_s": 0.1, "shutdown_grace_s": 3.0, **settings}.items():
        rendered = str(value).lower() if isinstance(value, bool) else repr(value)
        text, count = re.subn(rf"(?m)^{key} = [^\n#]*", f"{key} = {rendered}  ", text)
        if count == 0:
            section = "[server]" if key in ("drain_delay_s", "shutdown_grace_s") else "[privacy]"
            text = text.replace(section, f"{section}\n{key} = {rendered}", 1)
    config_path.write_text(text)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def start(directory: Path, port: int, timeout_s: float = 120.0) -> int:
    """Start `target-owner-node serve` detached; return its pid once it is listening."""
    log = directory / "server.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "target_owner_node.cli", "serve", "--config", str(directory / "config.toml"),
             "--port", str(port)],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT,
        )
    (directory / "server.pid").write_text(str(process.pid))
    marker = f"listening on 127.0.0.1:{port}".encode()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if marker in log.read_bytes():
            return process.pid
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}; see {log}")
        time.sleep(0.1)
    raise RuntimeError(f"the server did not listen within {timeout_s:.0f} s; see {log}")


def stop(directory: Path, timeout_s: float = 60.0) -> None:
    """SIGTERM the server in server.pid and wait until it is gone (SIGKILL after timeout)."""
    pidfile = directory / "server.pid"
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text())
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)


def restart_command(directory: Path, port: int) -> str:
    script = Path(__file__).resolve()
    return f"{sys.executable} {script} restart --dir {directory} --port {port}"


LAUNCH_CONFIG = """\
[data]
heldout_path = {heldout}
min_heldout_size = {min_rows}
verifier = "per_example"

[evaluation]
max_new_tokens = 16
max_samples_per_prompt = 8
batch_size = 16
timeout_s = 600

[privacy]
enabled = {dp}
epsilon_budget = {epsilon}
delta = 1e-6
planned_releases = {planned_releases}
sample_rate = {sample_rate}

[tls]
ca_cert = {ca}
server_cert = {cert}
server_key = {key}

[server]
shutdown_grace_s = 3.0
drain_delay_s = 0.1

[storage]
dir = "storage"
"""


def write_launch_config(args: argparse.Namespace) -> Path:
    """The config of a launched owner: the given held-out file and certificates, storage in the work folder."""
    import json

    rows = sum(1 for line in Path(args.heldout).read_text().splitlines() if line.strip())
    args.workdir.mkdir(parents=True, exist_ok=True)
    path = args.workdir / "config.toml"
    path.write_text(LAUNCH_CONFIG.format(
        heldout=json.dumps(str(Path(args.heldout).resolve())), min_rows=min(100, rows),
        dp="false" if args.no_dp else "true", epsilon=repr(args.epsilon), planned_releases=args.planned_releases,
        sample_rate=repr(args.sample_rate), **{k: json.dumps(str(Path(getattr(args, k)).resolve()))
                                               for k in ("ca", "cert", "key")}))
    return path


def launch(args: argparse.Namespace) -> int:
    """Serve like `target-owner-node serve`, with the breakage applied, until SIGTERM."""
    import threading

    from target_owner_node.config import load_config
    from target_owner_node.server import start_server
    from tests.protocol.broken_servers import launch_breakage

    config = load_config(write_launch_config(args))
    running = start_server(config, f"127.0.0.1:{args.port}", **launch_breakage(args.break_kind, config))
    stop_event = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop_event.set())
    print(f"listening on 127.0.0.1:{running.port}", flush=True)
    start_worker = getattr(running.node.scorer, "start", None)
    if start_worker is not None:
        threading.Thread(target=start_worker, daemon=True).start()
    while not stop_event.wait(0.2):
        pass
    running.shutdown()
    return 0


def launch_command(kind: str = "none") -> str:
    """A --launch-cmd template running this script's `launch` with breakage `kind`."""
    script = Path(__file__).resolve()
    return (f"{sys.executable} {script} launch --break {kind} --heldout {{heldout}} --port {{port}} "
            "--workdir {workdir} --ca {ca_cert} --cert {server_cert} --key {server_key} {owner_options}")


LEDGER_PATH = "{workdir}/storage/privacy_ledger.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="start/stop/restart/launch an owner node for the conformance tests")
    parser.add_argument("action", choices=["start", "stop", "restart", "launch"])
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--port", type=int)
    parser.add_argument("--break", dest="break_kind", default="none", help="launch: the breakage to apply")
    parser.add_argument("--heldout", type=Path)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--ca", type=Path)
    parser.add_argument("--cert", type=Path)
    parser.add_argument("--key", type=Path)
    parser.add_argument("--no-dp", action="store_true")
    parser.add_argument("--sample-rate", type=float, default=0.1)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--planned-releases", type=int, default=500)
    args = parser.parse_args(argv)
    if args.action == "launch":
        return launch(args)
    if args.dir is None:
        parser.error(f"{args.action} needs --dir")
    if args.action in ("stop", "restart"):
        stop(args.dir)
    if args.action in ("start", "restart"):
        start(args.dir, args.port)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
