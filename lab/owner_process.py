"""Run a target owner as a separate local process, for `simulate` and benchmarks.

The trainer never imports target_owner_node: it runs the owner's own CLI
(`target-owner-node init` then `target-owner-node serve`) as a child process, so only that
process reads the target data, exactly as in a two-party deployment. The child is always
terminated on exit (SIGTERM, then SIGKILL), so no stray processes are left behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from trainer_node.feedback.client import ClientSettings

LISTENING = re.compile(r"listening on (\S+):(\d+)")


class OwnerProcessError(RuntimeError):
    """The owner process failed to start, or died."""


def _die_with_parent() -> None:
    """Linux: SIGTERM the owner when the trainer process dies, even by SIGKILL, so a killed
    simulate never leaves an orphaned owner (it runs in its own session)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _owner_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "target_owner_node.cli", *args]


def init_owner(
    directory: Path, testbed: str, dp: bool, extra_args: list[str] = (), test_split: bool = False
) -> None:
    """`target-owner-node init DIR`: config, fresh mTLS PKI and the testbed's target splits.

    `test_split` serves SPLIT_TEST (exact accuracy, no privacy guarantee; off in what init
    writes by default): the simulation's before/after measurements use it.
    """
    args = ["init", str(directory), "--testbed", testbed, "--server-name", "localhost", *extra_args]
    if not dp:
        args.append("--no-dp")
    if test_split:
        args.append("--enable-test-split")
    result = subprocess.run(_owner_cli(*args), capture_output=True, text=True)
    if result.returncode != 0:
        raise OwnerProcessError(f"target-owner-node init failed:\n{result.stderr.strip() or result.stdout.strip()}")


class OwnerProcess:
    """`target-owner-node serve` on a free loopback port, as a context manager."""

    def __init__(self, directory: Path, startup_timeout_s: float = 120.0):
        self.directory = Path(directory)
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._stderr_tail: deque[str] = deque(maxlen=40)

    def __enter__(self) -> OwnerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        config = self.directory / "config.toml"
        self.proc = subprocess.Popen(
            _owner_cli("serve", "--config", str(config), "--port", "0"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # our Ctrl-C does not hit it first; we stop it in order
            preexec_fn=_die_with_parent,
        )
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        deadline = time.monotonic() + self.startup_timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            match = LISTENING.search(line)
            if match:
                self.port = int(match.group(2))
                threading.Thread(target=self._drain_stdout, daemon=True).start()
                return
        self.stop()
        raise OwnerProcessError("target-owner-node serve did not start:\n" + "\n".join(self._stderr_tail))

    def _drain_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr_tail.append(line.rstrip())

    def check_alive(self) -> None:
        """Raise OwnerProcessError if the owner process has exited."""
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            tail = "\n".join(list(self._stderr_tail)[-10:])
            raise OwnerProcessError(f"the target-owner process exited (code {code}); its last log lines:\n{tail}")

    def stop(self, grace_s: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)

    def client_settings(self, **overrides) -> ClientSettings:
        pki = self.directory / "pki"
        return ClientSettings(
            target=f"127.0.0.1:{self.port}",
            ca_cert=pki / "ca.pem",
            client_cert=pki / "client.pem",
            client_key=pki / "client.key",
            server_name="localhost",
            **overrides,
        )
