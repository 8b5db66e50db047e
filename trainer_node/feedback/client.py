"""A gRPC client for a target owner: mTLS, a deadline on every call, and retries only where
they are safe.

Retry policy (protocol/errors.py is the contract):
- unary calls (GetInfo, GetBudget, Evaluate) retry UNAVAILABLE with grpc's own retry policy,
  set as the channel's service config (`retry_service_config`): exponential backoff with
  jitter, at most `max_attempts` attempts (grpc caps it at 5). Evaluate carries an
  idempotency key (request_id) that every attempt repeats, so a retried release is never
  charged twice. The streaming upload, which grpc's retry buffer cannot hold, is retried here
  and resumes by content address (files the owner already holds are not resent).
- RESOURCE_EXHAUSTED (e.g. PRIVACY_BUDGET_EXHAUSTED) is never retried: BudgetExhausted.
- UNAUTHENTICATED and PERMISSION_DENIED are never retried: OwnerRefused (a certificate or
  allowlist problem; trainer_node/feedback/preflight.py makes it fatal at start).
- Everything else raises FeedbackError with the server's reason.

grpc reports a TLS verification or hostname failure as UNAVAILABLE too, like an outage; the
pre-flight check (preflight.py) tells them apart at start with a TLS handshake of its own.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from protocol import errors
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.generated.target_feedback.v1 import target_feedback_pb2_grpc as pb_grpc
from protocol.validation import MAX_CHUNK_BYTES, is_allowed_file_name, sha256_file

log = logging.getLogger("trainer_node.feedback")
T = TypeVar("T")


class FeedbackError(RuntimeError):
    """A feedback call failed for good. `reason` is the server's ErrorInfo reason, if any."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None, reason: str | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason


class BudgetExhausted(FeedbackError):
    """The owner refused a release because a privacy budget is spent. Never retry."""


class OwnerUnavailable(FeedbackError):
    """The owner could not be reached after all retries."""


class OwnerRefused(FeedbackError):
    """The owner refused this client (UNAUTHENTICATED / PERMISSION_DENIED). Never retried."""


SERVICE_NAME = "target_feedback.v1.TargetFeedbackService"
UNARY_METHODS = ("GetInfo", "GetBudget", "Evaluate")
MAX_GRPC_ATTEMPTS = 5  # grpc caps a retry policy's maxAttempts at 5


def retry_service_config(max_attempts: int, initial_backoff_s: float, max_backoff_s: float) -> dict:
    """The channel's service config: retry UNAVAILABLE on the unary methods (no policy for 1 attempt)."""
    method: dict = {"name": [{"service": SERVICE_NAME, "method": name} for name in UNARY_METHODS]}
    if max_attempts >= 2:
        method["retryPolicy"] = {
            "maxAttempts": min(max_attempts, MAX_GRPC_ATTEMPTS),
            "initialBackoff": f"{initial_backoff_s:g}s",
            "maxBackoff": f"{max_backoff_s:g}s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }
    return {"methodConfig": [method]}


@dataclass(frozen=True)
class ClientSettings:
    target: str                      # host:port
    ca_cert: Path | None = None      # the owner's CA (None only with insecure=True)
    client_cert: Path | None = None
    client_key: Path | None = None
    server_name: str | None = None   # TLS name override when the address is an IP not in the cert
    insecure: bool = False           # plaintext, loopback-only test setups
    deadline_s: float = 30.0         # unary calls
    evaluate_deadline_s: float = 600.0
    upload_deadline_s: float = 600.0
    max_attempts: int = 5            # UNAVAILABLE retries, unary (grpc, at most 5) and upload (here)
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0


UPLOAD_METHOD = "/target_feedback.v1.TargetFeedbackService/UploadCheckpoint"
RACY_MARGIN_NS = 100_000_000  # file timestamps can be as coarse as a clock tick; 0.1 s is ample


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def chunk_message(name: str, offset: int, data: bytes) -> bytes:
    """UploadCheckpointRequest{chunk: FileChunk{name, offset, data}}, serialized by hand (fields
    2 chunk, 1 name, 2 offset, 3 data of the protobuf wire format, zero values omitted as proto3
    does): the bytes the generated classes write, with `data` copied once instead of into a
    message object and again by its serializer (tests/trainer_node/test_feedback_client.py)."""
    encoded = name.encode("utf-8")
    inner = b"".join((
        b"\x0a", _varint(len(encoded)), encoded,
        (b"\x10" + _varint(offset)) if offset else b"",
        (b"\x1a" + _varint(len(data))) if data else b"",
    ))
    return b"".join((b"\x12", _varint(len(inner) + len(data)), inner, data))




class TargetFeedbackClient:
    """One connection to one target owner."""

    def __init__(self, settings: ClientSettings, sleep: Callable[[float], None] = time.sleep):
        self.settings = settings
        self._sleep = sleep
        self._channel = self._open_channel(settings)
        self._stub = pb_grpc.TargetFeedbackServiceStub(self._channel)
        # UploadCheckpoint with pre-serialized requests (see _upload_once); same method, same wire.
        self._upload_call = self._channel.stream_unary(
            UPLOAD_METHOD,
            request_serializer=bytes,
            response_deserializer=pb.UploadCheckpointResponse.FromString,
        )
        self.last_upload_bytes = 0
        # sha256 of files the owner is known to hold: they are not resent (content addressing).
        self._owner_holds: set[str] = set()
        self._digest_cache: dict[tuple[int, int, int, int], tuple[str, int]] = {}  # identity -> (sha, hashed at)

    @staticmethod
    def _open_channel(s: ClientSettings) -> grpc.Channel:
        service_config = retry_service_config(s.max_attempts, s.backoff_initial_s, s.backoff_max_s)
        options = [
            ("grpc.max_send_message_length", 4 * MAX_CHUNK_BYTES),
            ("grpc.max_receive_message_length", 4 * MAX_CHUNK_BYTES),
            ("grpc.enable_retries", 1),
            ("grpc.service_config", json.dumps(service_config)),
        ]
        if s.insecure:
            return grpc.insecure_channel(s.target, options=options)
        if s.ca_cert is None:
            raise ValueError("ClientSettings.ca_cert: the owner's CA certificate is required for TLS")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=Path(s.ca_cert).read_bytes(),
            private_key=Path(s.client_key).read_bytes() if s.client_key else None,
            certificate_chain=Path(s.client_cert).read_bytes() if s.client_cert else None,
        )
        if s.server_name:
            options.append(("grpc.ssl_target_name_override", s.server_name))
        return grpc.secure_channel(s.target, credentials, options=options)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> TargetFeedbackClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- RPCs -------------------------------------------------------------------------

    def info(self) -> pb.GetInfoResponse:
        return self._unary("GetInfo", lambda: self._stub.GetInfo(pb.GetInfoRequest(), timeout=self.settings.deadline_s))

    def budget(self) -> pb.GetBudgetResponse:
        return self._unary(
            "GetBudget", lambda: self._stub.GetBudget(pb.GetBudgetRequest(), timeout=self.settings.deadline_s)
        )

    def evaluate(
        self,
        checkpoint_ids: list[str],
        decoding: pb.DecodingSettings,
        split: int = pb.SPLIT_FEEDBACK,
        request_id: str | None = None,
        difference: pb.DifferenceRequest | None = None,
    ) -> pb.EvaluateResponse:
        """One release. With `difference`, a difference release (RELEASE_KIND_ACCURACY_DIFFERENCE):
        checkpoint_ids[0] is the base, and the response holds one difference per other checkpoint."""
        request = pb.EvaluateRequest(
            checkpoint_ids=checkpoint_ids, decoding=decoding, split=split, request_id=request_id or uuid.uuid4().hex,
            kind=pb.RELEASE_KIND_ACCURACY_DIFFERENCE if difference is not None else pb.RELEASE_KIND_UNSPECIFIED,
            difference=difference,
        )
        return self._unary(
            "Evaluate", lambda: self._stub.Evaluate(request, timeout=self.settings.evaluate_deadline_s)
        )

    def upload(self, model_dir: Path, digests: Mapping[str, str] | None = None) -> str:
        """Upload a checkpoint directory; returns the owner's checkpoint id.

        Files whose sha256 the owner already holds are listed in the manifest but not
        resent. If the owner lost them (MISSING_FILE_DATA), the upload is repeated in full.
        `digests` (file name -> sha256 hex), when the caller computed them while writing the
        files (trainer_node/feedback/candidates.py), are used as given instead of reading the
        files back to hash them. `last_upload_bytes` is what this upload sent.
        """
        files = self._manifest(Path(model_dir), digests or {})
        try:
            response = self._upload_once(Path(model_dir), files, skip=self._owner_holds)
        except FeedbackError as err:
            if err.reason != errors.MISSING_FILE_DATA:
                raise
            self._owner_holds.clear()
            response = self._upload_once(Path(model_dir), files, skip=set())
        self._owner_holds.update(entry.sha256 for entry in files)
        self.last_upload_bytes = int(response.bytes_received)
        return response.checkpoint_id

    # --- internals ----------------------------------------------------------------------

    def _manifest(self, model_dir: Path, digests: Mapping[str, str]) -> list[pb.FileEntry]:
        entries = []
        for path in sorted(model_dir.iterdir()):
            if not path.is_file():
                continue
            if not is_allowed_file_name(path.name):
                raise FeedbackError(f"{path}: not an allowed checkpoint file; only safetensors and config JSON are sent")
            stat = path.stat()
            digest = digests.get(path.name) or self._file_digest(path, stat)
            entries.append(pb.FileEntry(name=path.name, size=stat.st_size, sha256=digest))
        if not entries:
            raise FeedbackError(f"{model_dir}: no checkpoint files to upload")
        return entries

    def _file_digest(self, path: Path, stat: os.stat_result) -> str:
        """sha256 of a file, cached by the file's identity (a hard link to a file hashed before
        hits the cache). As in git's "racy" rule, an entry is trusted only when the file's mtime is
        clearly older than the hashing: a rewrite within the same clock tick is hashed again."""
        key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        cached = self._digest_cache.get(key)
        if cached is not None and cached[1] - stat.st_mtime_ns > RACY_MARGIN_NS:
            return cached[0]
        hashed_at = time.time_ns()
        digest = sha256_file(path)
        self._digest_cache[key] = (digest, hashed_at)
        return digest

    def _upload_once(self, model_dir: Path, files: list[pb.FileEntry], skip: set[str]) -> pb.UploadCheckpointResponse:
        chunk_bytes = MAX_CHUNK_BYTES

        def requests() -> Iterator[bytes]:
            # Pre-serialized messages (chunk_message): the data is copied once into the message
            # instead of into a protobuf object and again by its serializer.
            yield pb.UploadCheckpointRequest(manifest=pb.CheckpointManifest(files=files)).SerializeToString()
            for entry in files:
                if entry.sha256 in skip:
                    continue
                with open(model_dir / entry.name, "rb", buffering=0) as fh:
                    offset = 0
                    while block := fh.read(chunk_bytes):
                        yield chunk_message(entry.name, offset, block)
                        offset += len(block)

        return self._with_retries(
            "UploadCheckpoint",
            lambda: self._upload_call(requests(), timeout=self.settings.upload_deadline_s),
        )

    def _unary(self, name: str, call: Callable[[], T]) -> T:
        """One unary call; grpc's retry policy (the channel's service config) retries UNAVAILABLE."""
        try:
            return call()
        except grpc.RpcError as err:
            raise call_error(name, err, f"after up to {min(self.settings.max_attempts, MAX_GRPC_ATTEMPTS)} "
                                        "attempts") from None

    def _with_retries(self, name: str, call: Callable[[], T]) -> T:
        """The streaming upload's retry loop (grpc cannot buffer a stream for its retries)."""
        delay = self.settings.backoff_initial_s
        for attempt in range(1, self.settings.max_attempts + 1):
            try:
                result = call()
                log.debug("feedback call ok", extra={"rpc": name, "attempt": attempt})
                return result
            except grpc.RpcError as err:
                code = err.code()
                if code != grpc.StatusCode.UNAVAILABLE or attempt == self.settings.max_attempts:
                    raise call_error(name, err, f"after {attempt} attempts") from None
                log.warning("owner unavailable; retrying", extra={"rpc": name, "attempt": attempt, "sleep_s": delay})
                self._sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, self.settings.backoff_max_s)
        raise AssertionError("unreachable")


def call_error(name: str, err: grpc.RpcError, attempts: str) -> FeedbackError:
    """The FeedbackError for a failed call, by status code (the module docstring's policy)."""
    code, reason = err.code(), errors.reason_of(err)
    detail = f"{name} failed: {code.name}" + (f" {reason}" if reason else "") + f": {err.details()}"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return BudgetExhausted(detail, code, reason)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return OwnerRefused(detail, code, reason)
    if code == grpc.StatusCode.UNAVAILABLE:
        return OwnerUnavailable(f"{detail} ({attempts})", code, reason)
    return FeedbackError(detail, code, reason)
