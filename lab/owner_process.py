"""A local target owner for `simulate` and the bench: set up in-process, served as a child process.

`init_owner` calls the owner's own scaffold (target_owner_node.scaffold.init_node) with typed
values: config, fresh mTLS PKI, the testbed's target splits. The SERVER then runs as its own
process (`target-owner-node serve`), so only that process serves the target data, exactly as
in a two-party deployment. The child is always terminated on exit (SIGTERM, then SIGKILL), so
no stray processes are left behind.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from trainer_node.feedback.client import ClientSettings

LISTENING = re.compile(r"listening on (\S+):(\d+)")


class OwnerProcessError(RuntimeError):
    """The owner process failed to start, or died."""


def _child_setup(nice: int, idle: bool = False) -> None:
    """In the owner's child before exec: its CPU priority (inherited by its scoring worker), and
    die_with_parent. `idle`: SCHED_IDLE where the platform has it (Linux), else nice 19; otherwise
    `nice`. A few system calls, no locks: safe after fork."""
    if idle and hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    elif idle:
        os.nice(19)
    elif nice:
        os.nice(nice)
    die_with_parent()


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: send `sig` to the owner when the trainer process dies, even by SIGKILL, so a killed
    simulate never leaves an orphaned owner (it runs in its own session). A process its parent
    may have stopped (SIGSTOP) needs SIGKILL: a stopped process keeps other signals pending."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def _owner_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "target_owner_node.cli", *args]


def init_owner(
    directory: Path,
    testbed: str,
    *,
    dp: bool,
    test_split: bool = False,
    epsilon: float | None = None,
    sample_rate: float | None = None,
    planned_releases: int | None = None,
    max_prompt_tokens: int | None = None,
    batch_size: int | None = None,
    feedback_verifier: str | Mapping[str, Any] | None = None,
    dtype: str | None = None,
) -> None:
    """A complete owner folder (what `target-owner-node init DIR` writes), server name localhost.

    `test_split` serves SPLIT_TEST (exact accuracy, no privacy guarantee; off in what init
    writes by default): the simulation's before/after measurements use it. A setting left
    None takes the owner's own default (target_owner_node.scaffold.init_node).

    `batch_size` sets the owner's public fixed batch (evaluation.batch_size): the simulation
    uses one batch per query's rows (`query_batch_size`), as an owner of a small model would.
    A local owner is stopped with the run, so it skips the drain delay health checkers need.
    `feedback_verifier` sets the owner's data.feedback_verifier (a registered verifier name or an
    options table; the test split stays exact): the run config's simulated_owner.feedback_verifier.
    `dtype` sets evaluation.dtype (simulated_owner.dtype).
    """
    from target_owner_node.config import load_config
    from target_owner_node.scaffold import init_node

    given = {"epsilon": epsilon, "sample_rate": sample_rate, "planned_releases": planned_releases,
             "max_prompt_tokens": max_prompt_tokens}
    try:
        result = init_node(Path(directory), testbed=testbed, server_names=["localhost"], dp_enabled=dp,
                           test_split_enabled=test_split, **{k: v for k, v in given.items() if v is not None})
    except (FileExistsError, ValueError, KeyError) as error:
        raise OwnerProcessError(f"target-owner setup in {directory} failed: {error}") from None
    config_path = result.config_path
    text = config_path.read_text()
    text = re.sub(r"(?m)^drain_delay_s = [0-9.]+", "drain_delay_s = 0.0", text)
    if batch_size is not None:
        text = re.sub(r"(?m)^batch_size = \d+", f"batch_size = {int(batch_size)}", text)
    if dtype is not None:
        text, found = re.subn(r"(?m)^\[evaluation\]$", f"[evaluation]\ndtype = {json.dumps(dtype)}", text, count=1)
        if not found:
            raise OwnerProcessError(f"no [evaluation] section in {config_path} to set evaluation.dtype in")
    if feedback_verifier is not None:
        from lab.bench.tomlwrite import toml_value

        text, found = re.subn(r"(?m)^\[data\]$", f"[data]\nfeedback_verifier = {toml_value(feedback_verifier)}",
                              text, count=1)
        if not found:
            raise OwnerProcessError(f"no [data] section in {config_path} to set data.feedback_verifier in")
    config_path.write_text(text)
    config = load_config(config_path)  # the edited file must still be a valid owner config
    if batch_size is not None and config.evaluation.batch_size != batch_size:
        raise OwnerProcessError(f"could not set evaluation.batch_size = {batch_size} in {config_path}")
    if dtype is not None and config.evaluation.dtype != dtype:
        raise OwnerProcessError(f"could not set evaluation.dtype = {dtype!r} in {config_path}")
    if feedback_verifier is not None and config.data.feedback_verifier != feedback_verifier:
        raise OwnerProcessError(f"could not set data.feedback_verifier = {feedback_verifier!r} in {config_path}")


def query_batch_size(heldout_size: int, sample_rate: float, dp: bool) -> int:
    """The public rows every feedback query evaluates (rows_per_query; all rows without DP)."""
    from protocol.privacy.mechanisms import rows_per_query
    from target_owner_node.config import PrivacyConfig

    tail = PrivacyConfig.model_fields["row_cap_tail"].default
    return rows_per_query(heldout_size, sample_rate, tail) if dp else heldout_size


class OwnerProcess:
    """`target-owner-node serve` on a free loopback port, as a context manager."""

    def __init__(self, directory: Path, startup_timeout_s: float = 120.0, nice: int = 0, idle: bool = False,
                 noise_seed: int | None = None):
        """`nice` lowers the owner's CPU priority (its server and worker), and `idle` lowers it
        to the least there is (SCHED_IDLE, overriding `nice`): on a machine the trainer shares,
        the owner then computes on what the trainer leaves idle. `noise_seed` makes its releases'
        subsamples and noise reproducible (`serve --insecure-noise-seed`: no privacy, simulations only)."""
        if not 0 <= nice <= 19:
            raise ValueError(f"nice must be in 0..19, got {nice}")
        self.directory = Path(directory)
        self.startup_timeout_s = startup_timeout_s
        self.nice = nice
        self.idle = bool(idle)
        self.noise_seed = noise_seed
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._stderr_tail: deque[str] = deque(maxlen=40)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        config = self.directory / "config.toml"
        seeded = () if self.noise_seed is None else ("--insecure-noise-seed", str(self.noise_seed))
        self.proc = subprocess.Popen(
            _owner_cli("serve", "--config", str(config), "--port", "0", *seeded),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # our Ctrl-C does not hit it first; we stop it in order
            preexec_fn=functools.partial(_child_setup, self.nice, self.idle),  # noqa: PLW1509  see _child_setup
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
