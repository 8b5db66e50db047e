"""Shared state of one conformance run: connections, the server's public card, uploaded
checkpoints, and helpers every check uses to call the server and judge errors."""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from protocol.conformance.checkpoints import (
    CheckpointFile,
    load_checkpoint_dir,
    stream,
    tiny_checkpoint_files,
    upload_messages,
)
from protocol.conformance.connection import Connection, Identity, plaintext_connection, secure_connection
from protocol.conformance.launcher import LaunchTemplate, LedgerPathTemplate, OwnerLauncher
from protocol.conformance.options import SuiteOptions
from protocol.conformance.recorder import Failure, Recorder, describe_failure
from protocol.conformance.registry import CheckFailed, CheckSkipped
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

T = TypeVar("T")
SERVICE_PREFIX = "/target_feedback.v1.TargetFeedbackService/"


@dataclass(frozen=True)
class RestartObservation:
    """Budget state around one restart, plus a release made just before it."""

    before: pb.GetBudgetResponse
    after: pb.GetBudgetResponse
    release_request: pb.EvaluateRequest | None
    release_before: pb.EvaluateResponse | None


class SuiteContext:
    """Everything the checks share. Created by run_suite; checks use its helpers."""

    def __init__(self, options: SuiteOptions) -> None:
        self.options = options
        self.recorder = Recorder()
        self.identity = Identity.from_files(options.ca, options.cert, options.key)
        self._temp = tempfile.TemporaryDirectory(prefix="conformance-")
        self.work_dir = Path(options.work_dir) if options.work_dir else Path(self._temp.name)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.conn = self.connect()
        self._info: pb.GetInfoResponse | None = None
        self._lock = threading.Lock()
        self._checkpoints: dict[int, str] = {}
        self._files: dict[int, list[CheckpointFile]] = {}
        self.releases: list[pb.EvaluateResponse] = []       # every DP release the suite received
        self._candidates_released = 0                        # sum of candidates over those releases
        self._planning: tuple[int, int] | None = None        # (estimate, _candidates_released) at last GetBudget
        self.noise_values: list[float] | None = None
        self.restart: RestartObservation | None = None
        self.rogue = None                                    # protocol.conformance.pki.RoguePki, lazily
        self._launcher: OwnerLauncher | None = None
        self.provoked = False                                # failures provoked on every RPC already

    # -- connections -------------------------------------------------------------------------
    def connect(self, identity: Identity | None = None, unique: str | None = None) -> Connection:
        return secure_connection(
            self.options.target, identity or self.identity, self.recorder, self.options.server_name, unique
        )

    def connect_plaintext(self, unique: str | None = None) -> Connection:
        return plaintext_connection(self.options.target, self.recorder, unique)

    def close(self) -> None:
        self.conn.close()
        self._temp.cleanup()

    # -- plain calls -------------------------------------------------------------------------
    def info(self, refresh: bool = False) -> pb.GetInfoResponse:
        if self._info is None or refresh:
            self._info = self.conn.stub.GetInfo(pb.GetInfoRequest(), timeout=self.options.call_deadline_s)
        return self._info

    def budget(self) -> pb.GetBudgetResponse:
        response = self.conn.stub.GetBudget(pb.GetBudgetRequest(), timeout=self.options.budget_deadline_s)
        with self._lock:
            self._planning = (response.releases_remaining_estimate, self._candidates_released)
        return response

    @property
    def dp_enabled(self) -> bool:
        return self.info().privacy.enabled

    def decoding(self, seed: int = 0) -> pb.DecodingSettings:
        limit = self.info().decoding_limits.max_new_tokens or self.options.max_new_tokens
        return pb.DecodingSettings(
            max_new_tokens=min(self.options.max_new_tokens, limit), samples_per_prompt=1, temperature=0.0, seed=seed
        )

    def evaluate_request(self, checkpoint_ids: list[str], request_id: str | None = None, **fields) -> pb.EvaluateRequest:
        decoding = fields.pop("decoding", None)
        return pb.EvaluateRequest(
            checkpoint_ids=checkpoint_ids,
            decoding=decoding if decoding is not None else self.decoding(),
            split=fields.pop("split", pb.SPLIT_FEEDBACK),
            request_id=request_id or uuid.uuid4().hex,
            **fields,
        )

    def evaluate(self, request: pb.EvaluateRequest, connection: Connection | None = None) -> pb.EvaluateResponse:
        """One Evaluate that may evaluate (long deadline); DP releases are remembered."""
        response = (connection or self.conn).stub.Evaluate(request, timeout=self.options.evaluate_deadline_s)
        if request.split in (pb.SPLIT_UNSPECIFIED, pb.SPLIT_FEEDBACK) and response.privacy.epsilon_this_release > 0:
            with self._lock:
                self.releases.append(response)
                self._candidates_released += len(request.checkpoint_ids)
        return response

    def release(self, checkpoint_ids: list[str] | None = None, request_id: str | None = None) -> pb.EvaluateResponse:
        """One feedback release of the suite's checkpoint (or of `checkpoint_ids`)."""
        return self.evaluate(self.evaluate_request(checkpoint_ids or [self.checkpoint_id()], request_id))

    def upload(self, messages: list[pb.UploadCheckpointRequest], timeout: float | None = None) -> pb.UploadCheckpointResponse:
        return self.conn.stub.UploadCheckpoint(stream(messages), timeout=timeout or max(60.0, self.options.call_deadline_s))

    # -- the suite's own checkpoints -----------------------------------------------------------
    def checkpoint_files(self, seed: int = 0) -> list[CheckpointFile]:
        with self._lock:
            if seed not in self._files:
                if self.options.checkpoint_dir is not None and seed == 0:
                    self._files[seed] = load_checkpoint_dir(self.options.checkpoint_dir)
                else:
                    self._files[seed] = tiny_checkpoint_files(seed)
            return self._files[seed]

    def checkpoint_id(self, seed: int = 0) -> str:
        """Id of a valid checkpoint on the server, uploading it on first use."""
        if seed not in self._checkpoints:
            response = self.upload(upload_messages(self.checkpoint_files(seed)))
            self._checkpoints[seed] = response.checkpoint_id
        return self._checkpoints[seed]

    def forget_uploads(self) -> None:
        """After a restart: re-upload on next use (content addressing makes that cheap)."""
        self._checkpoints.clear()

    # -- judging errors ------------------------------------------------------------------------
    def expect_error(
        self,
        call: Callable[[], object],
        code: grpc.StatusCode | tuple[grpc.StatusCode, ...],
        reasons: str | tuple[str, ...] | None = None,
        what: str = "the call",
    ) -> Failure:
        """Run `call`; it must fail with `code` (one of) and, if given, an ErrorInfo reason
        among `reasons`. Returns the failure for further checks."""
        codes = code if isinstance(code, tuple) else (code,)
        wanted = (reasons,) if isinstance(reasons, str) else reasons
        try:
            call()
        except grpc.RpcError as error:
            failure = describe_failure("", error)
        else:
            raise CheckFailed(f"{what} succeeded; expected {'/'.join(c.name for c in codes)}")
        got = f"{failure.code.name} {failure.reason or '(no ErrorInfo)'}"
        if failure.code not in codes:
            raise CheckFailed(f"{what}: expected {'/'.join(c.name for c in codes)}, got {got}: {failure.message[:120]}")
        if wanted and failure.reason not in wanted:
            raise CheckFailed(f"{what}: expected reason {'/'.join(wanted)}, got {got}")
        return failure

    @contextmanager
    def budget_unchanged(self, what: str) -> Iterator[None]:
        """The block must not spend budget or count a release (refused calls are free)."""
        before = self.budget()
        yield
        after = self.budget()
        if after.epsilon_spent != before.epsilon_spent or after.releases_made != before.releases_made:
            raise CheckFailed(
                f"{what} changed the budget: epsilon spent {before.epsilon_spent:.6g} -> {after.epsilon_spent:.6g}, "
                f"releases {before.releases_made} -> {after.releases_made}"
            )

    def require_dp(self) -> None:
        if not self.dp_enabled:
            raise CheckSkipped("the server runs with differential privacy disabled (GetInfo privacy.enabled=false)")

    def require_releases(self, needed: int, what: str) -> None:
        """SKIP unless the remaining budget allows `needed` more single-candidate releases."""
        if not self.dp_enabled:
            return
        if self._planning is not None and self.info().privacy.per_client_epsilon_cap == 0:
            # Plan from the last GetBudget minus what the suite released since (a k-candidate
            # release counts k, an over-estimate of its cost): saves a GetBudget per check.
            estimate, at = self._planning
            if estimate - (self._candidates_released - at) >= needed + 2:
                return
        budget = self.budget()
        if budget.releases_remaining_estimate < needed:
            raise CheckSkipped(
                f"{what} needs {needed} releases but the server estimates only "
                f"{budget.releases_remaining_estimate} remain in its budget"
            )
        if budget.client_epsilon_cap > 0 and self.releases:
            per_release = max(r.privacy.epsilon_this_release for r in self.releases[-3:])
            room = budget.client_epsilon_cap - budget.client_epsilon_spent
            if per_release > 0 and room / per_release < needed:
                raise CheckSkipped(f"{what} needs {needed} releases; the per-client cap leaves about {room / per_release:.0f}")

    # -- owners the suite launches on its own data ----------------------------------------------
    def launcher(self, what: str) -> OwnerLauncher:
        """The --launch-cmd launcher; SKIP (saying what is missing) without one."""
        if self.options.launch_cmd is None:
            raise CheckSkipped(f"no --launch-cmd given: {what} needs an owner the suite launches on its own data")
        if self._launcher is None:
            ledger = LedgerPathTemplate(self.options.ledger_path) if self.options.ledger_path else None
            self._launcher = OwnerLauncher(LaunchTemplate(self.options.launch_cmd), self.work_dir / "launched",
                                           self.options.launch_timeout_s, ledger)
        return self._launcher

    # -- restarts ------------------------------------------------------------------------------
    def wait_serving(self, timeout_s: float) -> None:
        """Wait until health says SERVING for the service (reconnecting as needed)."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            conn = self.connect(unique=uuid.uuid4().hex)
            try:
                last = conn.health_status("", timeout=2.0)
                if last == "SERVING":
                    return
            finally:
                conn.close()
            time.sleep(0.2)
        raise CheckFailed(f"the server did not report SERVING within {timeout_s:.0f} s after the restart (last: {last})")

    def restart_once(self) -> RestartObservation:
        """Restart the server once per run (cached): budget before/after and a release made
        just before the restart (its request_id is replayed by the idempotency check)."""
        if self.restart is not None:
            return self.restart
        if self.options.restart is None:
            raise CheckSkipped("no --restart-cmd given: the suite cannot restart the server")
        request = response = None
        if not self.dp_enabled or self.budget().releases_remaining_estimate >= 1:
            request = self.evaluate_request([self.checkpoint_id()])
            response = self.evaluate(request)
        before = self.budget()
        self.conn.close()
        self.options.restart()
        time.sleep(0.2)
        self.wait_serving(self.options.restart_timeout_s)
        self.conn = self.connect(unique=uuid.uuid4().hex)
        self.forget_uploads()
        after = self.budget()
        self.restart = RestartObservation(before, after, request, response)
        return self.restart


def is_service_failure(failure: Failure) -> bool:
    """A failure of the feedback service itself (not of health checks or transports)."""
    return failure.method.startswith(SERVICE_PREFIX)
