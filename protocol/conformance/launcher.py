"""Owners the suite launches itself (--launch-cmd): start one, wait until it serves, stop it.

Some properties can only be tested with control of the server's data: planting marker rows,
adding or removing one held-out row, relaunching after deleting the ledger. For those checks
the operator hands the suite a command TEMPLATE that starts an owner on data the suite chose.

The contract (what a launch command must do; any owner implementation can meet it):

  --launch-cmd TEMPLATE   a shell command (run with /bin/sh, in its own process group) that
      serves ONE owner in the foreground until SIGTERM. The suite fills these placeholders,
      shell-quoted:
        required  {heldout}      a JSONL file in the project's example format (one object per
                                 line: id, prompt, answer, verifier="exact_match"); serve it as
                                 the feedback split (no test split is needed)
                  {port}         listen on 127.0.0.1:{port}
                  {workdir}      an empty folder for ALL the owner's state (config, ledger, audit,
                                 checkpoints). A relaunch of the same owner gets the same folder
                                 again and must reuse what is there
                  {ca_cert}      trust client certificates signed by this CA (the suite's client
                                 certificate has CN "trainer")
                  {server_cert}, {server_key}   the server certificate (SANs localhost, 127.0.0.1)
        optional  {dp}           "true" or "false": release with differential privacy or exactly
                  {sample_rate}  Poisson sampling rate q of each DP release
                  {epsilon}      total privacy budget
                  {planned_releases}  releases the noise is calibrated for
                  {owner_options}  the four settings above as `target-owner-node launch` flags
                                 (--sample-rate Q --epsilon E --planned-releases N [--no-dp])
      The command reports readiness through grpc.health.v1 (SERVING) on the same port; it may
      refuse to start (exit, or never report SERVING within the launch timeout) when it cannot
      serve safely. A server without one of the optional settings ignores it: the checks read
      GetInfo and SKIP when the launched owner does not run what they need (e.g. DP off).
  --ledger-path TEMPLATE  where that owner keeps its privacy ledger, with {workdir}, e.g.
      "{workdir}/storage/privacy_ledger.jsonl" (the ledger-deletion check deletes this file).

This project's owner implements it as
  target-owner-node launch --heldout {heldout} --port {port} --workdir {workdir} --ca {ca_cert}
      --cert {server_cert} --key {server_key} {owner_options}

What the suite cannot see from outside, even with a launched owner: only statuses, response
bytes and wall-clock latency reach it. Memory use, logs, metrics endpoints and any other port
are not observed; timing effects smaller than the machine's timing noise over the stated call
count go unnoticed; and the checks prove the properties for the suite's own data and
checkpoints (prompt-independent models), not float-level batch invariance of real models,
which the owner's own tests must show.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from protocol.conformance.checkpoints import CheckpointFile, stream, upload_messages
from protocol.conformance.connection import Connection, Identity, secure_connection
from protocol.conformance.heldout_file import HeldoutRow, write_heldout
from protocol.conformance.recorder import Recorder
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

REQUIRED_PLACEHOLDERS = ("heldout", "port", "workdir", "ca_cert", "server_cert", "server_key")
OPTIONAL_PLACEHOLDERS = ("dp", "sample_rate", "epsilon", "planned_releases", "owner_options")
LEDGER_PLACEHOLDERS = ("workdir",)
CLIENT_NAME = "trainer"
STOP_GRACE_S = 30.0
CALL_DEADLINE_S = 60.0
EVALUATE_DEADLINE_S = 600.0
_PLACEHOLDER = re.compile(r"\{([A-Za-z_]+)\}")


class LaunchError(RuntimeError):
    """A launched owner did not come up (the message says how it ended and where its log is)."""


def _check_template(template: str, flag: str, required: tuple[str, ...], optional: tuple[str, ...]) -> None:
    names = _PLACEHOLDER.findall(template)
    unknown = sorted(set(names) - set(required) - set(optional))
    if unknown:
        raise ValueError(f"{flag}: unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)}; "
                         f"known: {', '.join('{' + n + '}' for n in required + optional)}")
    missing = [n for n in required if n not in names]
    if missing:
        raise ValueError(f"{flag}: the template must use {', '.join('{' + n + '}' for n in missing)} "
                         f"(required: {', '.join('{' + n + '}' for n in required)})")


@dataclass(frozen=True)
class LaunchSettings:
    """The optional settings a check asks of a launched owner."""

    dp: bool = True
    sample_rate: float = 0.5
    epsilon: float = 8.0
    planned_releases: int = 50

    def placeholders(self) -> dict[str, str]:
        flags = ["--sample-rate", repr(self.sample_rate), "--epsilon", repr(self.epsilon),
                 "--planned-releases", str(self.planned_releases)] + ([] if self.dp else ["--no-dp"])
        return {"dp": "true" if self.dp else "false", "sample_rate": repr(self.sample_rate),
                "epsilon": repr(self.epsilon), "planned_releases": str(self.planned_releases),
                "owner_options": " ".join(flags)}


class LaunchTemplate:
    """A validated --launch-cmd template (see the module docstring for the placeholders)."""

    def __init__(self, template: str) -> None:
        _check_template(template, "--launch-cmd", REQUIRED_PLACEHOLDERS, OPTIONAL_PLACEHOLDERS)
        self.template = template

    def render(self, values: dict[str, str]) -> str:
        """The shell command; every value is shell-quoted, except {owner_options}, which is a
        list of flags made by the suite (its values are numbers)."""
        def value(name: str) -> str:
            text = values[name]
            return text if name == "owner_options" else shlex.quote(text)

        return _PLACEHOLDER.sub(lambda m: value(m.group(1)), self.template)


class LedgerPathTemplate:
    """A validated --ledger-path template ({workdir} is required)."""

    def __init__(self, template: str) -> None:
        _check_template(template, "--ledger-path", LEDGER_PLACEHOLDERS, ())
        self.template = template

    def path(self, workdir: Path) -> Path:
        return Path(_PLACEHOLDER.sub(lambda m: str(workdir), self.template))


@dataclass(frozen=True)
class LaunchPki:
    """A fresh owner PKI made by the suite: the server's files for the command, the client's for the suite."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def create(cls, directory: Path) -> LaunchPki:
        from protocol.tls import write_owner_pki

        files = write_owner_pki(directory, ["localhost", "127.0.0.1"], client_name=CLIENT_NAME)
        return cls(files["ca_cert"], files["server_cert"], files["server_key"], files["client_cert"],
                   files["client_key"])

    def identity(self) -> Identity:
        return Identity.from_files(self.ca_cert, self.client_cert, self.client_key)


@dataclass(frozen=True)
class StartOutcome:
    """How a launch ended up: serving, or exited / still not serving at the timeout."""

    serving: bool
    exit_code: int | None     # set when the process exited before reporting SERVING
    seconds: float
    last_health: str

    def describe(self) -> str:
        if self.serving:
            return f"SERVING after {self.seconds:.1f} s"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code} after {self.seconds:.1f} s without serving"
        return f"not SERVING within {self.seconds:.0f} s (last health answer: {self.last_health})"


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the launched owner binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LaunchedOwner:
    """One owner started from the template. Use as a context manager: it is always stopped."""

    def __init__(self, command: str, port: int, workdir: Path, identity: Identity, log_path: Path,
                 timeout_s: float) -> None:
        self.command = command
        self.port = port
        self.workdir = workdir
        self.identity = identity
        self.log_path = log_path
        self.timeout_s = timeout_s
        self.recorder = Recorder()   # its own: the launched owner is not the server under test
        self.process: subprocess.Popen | None = None
        self.connection: Connection | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> StartOutcome:
        """Run the command and wait until it serves, exits or times out (never raises for those)."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, shell=True, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        started = time.monotonic()
        last = "no answer"
        while time.monotonic() - started < self.timeout_s:
            code = self.process.poll()
            if code is not None:
                return StartOutcome(False, code, time.monotonic() - started, last)
            with secure_connection(self.target, self.identity, self.recorder, unique=uuid.uuid4().hex) as probe:
                last = probe.health_status("", timeout=2.0)
            if last == "SERVING":
                self.connection = secure_connection(self.target, self.identity, self.recorder,
                                                    unique=uuid.uuid4().hex)
                return StartOutcome(True, None, time.monotonic() - started, last)
            time.sleep(0.2)
        return StartOutcome(False, None, time.monotonic() - started, last)

    def start_serving(self) -> Self:
        """start(), raising LaunchError unless the owner serves."""
        outcome = self.start()
        if not outcome.serving:
            self.stop()
            raise LaunchError(f"the launched owner {outcome.describe()}; {self.log_hint()}")
        return self

    # -- calls (the suite's client certificate; deadlines generous: first calls start the evaluator)
    def info(self) -> pb.GetInfoResponse:
        return self._stub().GetInfo(pb.GetInfoRequest(), timeout=CALL_DEADLINE_S)

    def budget(self) -> pb.GetBudgetResponse:
        return self._stub().GetBudget(pb.GetBudgetRequest(), timeout=CALL_DEADLINE_S)

    def upload(self, files: list[CheckpointFile]) -> str:
        """Upload `files`; returns the checkpoint id (raises grpc.RpcError when refused)."""
        response = self._stub().UploadCheckpoint(stream(upload_messages(files)), timeout=EVALUATE_DEADLINE_S)
        return response.checkpoint_id

    def evaluate(self, checkpoint_ids: list[str], decoding: pb.DecodingSettings) -> pb.EvaluateResponse:
        """One feedback Evaluate with a fresh request id."""
        request = pb.EvaluateRequest(checkpoint_ids=checkpoint_ids, decoding=decoding, split=pb.SPLIT_FEEDBACK,
                                     request_id=uuid.uuid4().hex)
        return self._stub().Evaluate(request, timeout=EVALUATE_DEADLINE_S)

    def evaluate_difference(self, checkpoint_ids: list[str], decoding: pb.DecodingSettings, metric: str,
                            clip: float) -> pb.EvaluateResponse:
        """One RELEASE_KIND_ACCURACY_DIFFERENCE release of checkpoint_ids[1:] against checkpoint_ids[0]."""
        request = pb.EvaluateRequest(checkpoint_ids=checkpoint_ids, decoding=decoding, split=pb.SPLIT_FEEDBACK,
                                     request_id=uuid.uuid4().hex, kind=pb.RELEASE_KIND_ACCURACY_DIFFERENCE,
                                     difference=pb.DifferenceRequest(metric=metric, clip=clip))
        return self._stub().Evaluate(request, timeout=EVALUATE_DEADLINE_S)

    def _stub(self):
        if self.connection is None:
            raise LaunchError("the launched owner is not serving (start_serving() first)")
        return self.connection.stub

    def log_hint(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        tail = " | ".join(line.strip()[:160] for line in lines[-2:])
        return f"its output is in {self.log_path}" + (f" (last lines: {tail})" if tail else "")

    def stop(self) -> int | None:
        """SIGTERM the command's process group, SIGKILL after STOP_GRACE_S; returns the exit code."""
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait(10)
        # The shell may have exited before a child it started: make sure nothing of the group lingers.
        _signal_group(process.pid, signal.SIGKILL)
        return process.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)   # start_new_session: the group id is the shell's pid
    except (ProcessLookupError, PermissionError):
        pass


class OwnerLauncher:
    """Makes launched owners for one suite run: held-out files, work folders, ports, one PKI."""

    def __init__(self, template: LaunchTemplate, base_dir: Path, timeout_s: float,
                 ledger_path: LedgerPathTemplate | None = None) -> None:
        self.template = template
        self.ledger_path = ledger_path
        self.base_dir = Path(base_dir)
        self.timeout_s = timeout_s
        self._pki: LaunchPki | None = None
        self._count = 0

    @property
    def pki(self) -> LaunchPki:
        if self._pki is None:
            self._pki = LaunchPki.create(self.base_dir / "pki")
        return self._pki

    def new_workdir(self, label: str) -> Path:
        self._count += 1
        workdir = self.base_dir / f"{self._count:02d}-{label}"
        workdir.mkdir(parents=True)
        return workdir

    def owner(self, rows: list[HeldoutRow], settings: LaunchSettings, workdir: Path) -> LaunchedOwner:
        """An owner (not yet started) serving `rows` with `settings`, its state in `workdir`.
        The held-out file sits beside the work folder, so the owner's folder holds only its own state."""
        heldout = write_heldout(workdir.with_name(workdir.name + "-heldout.jsonl"), rows)
        port = free_port()
        pki = self.pki
        values = {"heldout": str(heldout), "port": str(port), "workdir": str(workdir), "ca_cert": str(pki.ca_cert),
                  "server_cert": str(pki.server_cert), "server_key": str(pki.server_key), **settings.placeholders()}
        log = workdir.with_name(workdir.name + "-owner.log")
        return LaunchedOwner(self.template.render(values), port, workdir, pki.identity(), log, self.timeout_s)
