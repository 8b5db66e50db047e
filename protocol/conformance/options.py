"""What the suite needs to know about the server under test, and its tunable sizes."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from protocol.conformance.launcher import LaunchTemplate, LedgerPathTemplate

MIN_LATENCY_CALLS = 10
MIN_DIFFERENCE_NOISE_RELEASES = 10


@dataclass
class SuiteOptions:
    """Options of one conformance run. Only `target` and the three mTLS files are required.

    `restart` is a callable that restarts the server (returns once the restart was started;
    the suite then waits for health SERVING). The CLI builds it from --restart-cmd; library
    users (tests) may pass a Python function instead. `launch_cmd` / `ledger_path` enable the
    checks that need an owner on the suite's own data (protocol/conformance/launcher.py).
    """

    target: str                                   # HOST:PORT
    ca: Path                                      # the owner's CA certificate (PEM)
    cert: Path                                    # a client certificate the owner trusts
    key: Path                                     # its private key
    server_name: str | None = None                # TLS name override (address not in the cert)
    canaries: list[str] = field(default_factory=list)   # strings planted in held-out prompts/answers
    restart: Callable[[], None] | None = None
    ca_key: Path | None = None                    # the owner's CA key: enables the expired / no-clientAuth checks
    rogue_ca_dir: Path | None = None              # where the untrusted CA and certs are written (default: temp)
    allow_exhaust: bool = False                   # run the check that spends the whole budget
    only: list[str] | None = None                 # check ids (or 'prefix*') to run; None = all
    checkpoint_dir: Path | None = None            # a valid checkpoint to upload; None = build a tiny one
    work_dir: Path | None = None                  # scratch folder (default: temp)
    noise_releases: int = 30                      # R repeated releases for the noise check
    noise_alpha: float = 0.001                    # false-failure rate of each noise bound
    concurrency: int = 8                          # concurrent clients
    fuzz_examples: int = 60                       # hypothesis examples per fuzzed RPC
    fuzz_time_s: float = 20.0                     # time bound per fuzzed RPC
    fuzz_seed: int = 20240601
    call_deadline_s: float = 10.0                 # deadline of the suite's GetInfo / refused calls
    budget_deadline_s: float = 60.0               # deadline of GetBudget (generous: latency has its own check)
    max_unary_latency_s: float = 5.0              # rpc.latency: GetInfo / GetBudget must answer within this
    evaluate_deadline_s: float = 300.0            # deadline of Evaluate calls that do evaluate
    restart_timeout_s: float = 120.0              # how long to wait for SERVING after a restart
    max_exhaust_releases: int = 300               # the exhaustion check refuses to spend more than this
    max_new_tokens: int = 4                       # decoding of the suite's own releases (kept cheap)
    launch_cmd: str | None = None                 # template that starts an owner on suite data (launcher.py)
    ledger_path: str | None = None                # template of that owner's ledger file, with {workdir}
    launch_timeout_s: float = 180.0               # how long a launched owner may take to report SERVING
    status_calls: int = 8                         # evaluations of the status-independence check
    latency_calls: int = 60                       # K timed releases of the latency check
    difference_noise_releases: int = 32           # K releases of the difference-noise check (launched owner)

    def __post_init__(self) -> None:
        for name in ("noise_releases", "concurrency", "fuzz_examples", "max_exhaust_releases", "max_new_tokens",
                     "status_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"SuiteOptions.{name} must be >= 1, got {getattr(self, name)}")
        if self.noise_releases < 3:
            raise ValueError(f"SuiteOptions.noise_releases must be >= 3 to estimate a variance, got {self.noise_releases}")
        if not 0 < self.noise_alpha < 0.5:
            raise ValueError(f"SuiteOptions.noise_alpha must be in (0, 0.5), got {self.noise_alpha}")
        if self.latency_calls < MIN_LATENCY_CALLS:
            raise ValueError(f"SuiteOptions.latency_calls must be >= {MIN_LATENCY_CALLS} for a correlation test, "
                             f"got {self.latency_calls}")
        if self.difference_noise_releases < MIN_DIFFERENCE_NOISE_RELEASES:
            raise ValueError(f"SuiteOptions.difference_noise_releases must be >= {MIN_DIFFERENCE_NOISE_RELEASES} for "
                             f"a variance test, got {self.difference_noise_releases}")
        if self.launch_cmd is not None:
            LaunchTemplate(self.launch_cmd)       # raises ValueError naming the flag and placeholder
        if self.ledger_path is not None:
            LedgerPathTemplate(self.ledger_path)
        for name in ("ca", "cert", "key", "ca_key", "checkpoint_dir"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, Path(value))


def restart_from_command(command: str, timeout_s: float = 300.0) -> Callable[[], None]:
    """A restart callable running `command` in a shell; a non-zero exit raises RuntimeError."""

    def restart() -> None:
        result = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout_s, check=False)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"restart command {shlex.quote(command)} exited {result.returncode}: {tail[0]}")

    return restart


def read_canaries(path: Path) -> list[str]:
    """Canary strings, one per line; blank lines and surrounding whitespace are ignored."""
    canaries = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    canaries = [c for c in canaries if c]
    if not canaries:
        raise ValueError(f"{path}: no canaries (expected one string per line)")
    short = [c for c in canaries if len(c) < 6]
    if short:
        raise ValueError(f"{path}: canaries must be at least 6 characters to avoid chance matches; got {short[:3]}")
    return canaries
