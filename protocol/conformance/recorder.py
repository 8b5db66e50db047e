"""Records every byte the server sends to the suite, so that leak checks can scan all of it.

A client interceptor sits on every channel the suite opens. For each call it keeps the
serialized response, the error message, the initial and trailing metadata (the
grpc-status-details-bin trailer carries the error details) and, for failures, the parsed
google.rpc.Status, so later checks can ask "did any byte ever carry a canary?" and "did every
error carry an ErrorInfo?" over the whole run, failing calls included.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2, status_pb2

STATUS_DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class Received:
    """One piece of bytes that came from the server: `where` says which call and which part."""

    where: str
    data: bytes


@dataclass(frozen=True)
class Failure:
    """One failed call as the client saw it."""

    method: str                          # full path: /package.Service/Method
    code: grpc.StatusCode
    message: str
    has_status_details: bool
    status_matches_call: bool            # the rich status agrees with the call's code and message
    reason: str | None                   # ErrorInfo.reason, None when no ErrorInfo was attached
    domain: str | None
    error_info_count: int


def parse_status_details(trailing: tuple | None) -> status_pb2.Status | None:
    """The google.rpc.Status in the trailers, or None (also when it does not parse)."""
    for key, value in trailing or ():
        if key == STATUS_DETAILS_KEY:
            status = status_pb2.Status()
            try:
                status.ParseFromString(value)
            except Exception:  # noqa: BLE001 - malformed details are reported as "no details"
                return None
            return status
    return None


def error_infos(status: status_pb2.Status | None) -> list[error_details_pb2.ErrorInfo]:
    infos = []
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
    return infos


def describe_failure(method: str, error: grpc.RpcError) -> Failure:
    """Classify a failed call (works for any grpc.RpcError that is also a grpc.Call)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = (error.details() if hasattr(error, "details") else "") or ""
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    status = parse_status_details(trailing)
    infos = error_infos(status)
    matches = status is None or (status.code == code.value[0] and status.message == message)
    return Failure(
        method=method,
        code=code,
        message=message,
        has_status_details=status is not None,
        status_matches_call=matches,
        reason=infos[0].reason if infos else None,
        domain=infos[0].domain if infos else None,
        error_info_count=len(infos),
    )


class Recorder:
    """Thread-safe store of everything received and of every failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.received: list[Received] = []
        self.failures: list[Failure] = []
        self.calls = 0

    def mark(self) -> tuple[int, int]:
        """A position to pass to `received_since` / `failures_since`."""
        with self._lock:
            return len(self.received), len(self.failures)

    def received_since(self, mark: tuple[int, int] = (0, 0)) -> list[Received]:
        with self._lock:
            return list(self.received[mark[0]:])

    def failures_since(self, mark: tuple[int, int] = (0, 0)) -> list[Failure]:
        with self._lock:
            return list(self.failures[mark[1]:])

    def record_call(self, method: str, outcome: object) -> None:
        """Record a finished call: `outcome` is what an interceptor's continuation returned.
        `method` is the full path, e.g. /target_feedback.v1.TargetFeedbackService/GetInfo."""
        short = method.rsplit("/", 1)[-1]
        items: list[Received] = []
        failure: Failure | None = None
        error = outcome.exception() if hasattr(outcome, "exception") else None
        if error is not None:
            if isinstance(error, grpc.RpcError):
                failure = describe_failure(method, error)
                items.append(Received(f"{short} error message", failure.message.encode("utf-8", "replace")))
                items += _metadata_items(short, "initial metadata", _safe(error, "initial_metadata"))
                items += _metadata_items(short, "trailing metadata", _safe(error, "trailing_metadata"))
        else:
            response = outcome.result()
            if hasattr(response, "SerializeToString"):
                items.append(Received(f"{short} response", response.SerializeToString()))
            items += _metadata_items(short, "initial metadata", _safe(outcome, "initial_metadata"))
            items += _metadata_items(short, "trailing metadata", _safe(outcome, "trailing_metadata"))
        with self._lock:
            self.calls += 1
            self.received.extend(items)
            if failure is not None:
                self.failures.append(failure)

    def interceptor(self) -> RecordingInterceptor:
        return RecordingInterceptor(self)


def _safe(call: object, name: str) -> tuple | None:
    getter = getattr(call, name, None)
    try:
        return getter() if getter is not None else None
    except Exception:  # noqa: BLE001 - some outcomes have no call object behind them
        return None


def _metadata_items(method: str, part: str, metadata: tuple | None) -> list[Received]:
    items = []
    for key, value in metadata or ():
        data = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
        items.append(Received(f"{method} {part} {key}", key.encode() + b": " + data))
    return items


class RecordingInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.StreamUnaryClientInterceptor):
    """Hands every finished unary and client-streaming call to the Recorder."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def _intercept(self, continuation, details, request):
        outcome = continuation(details, request)
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        outcome.add_done_callback(lambda done: self.recorder.record_call(method, done))
        return outcome

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return self._intercept(continuation, client_call_details, request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return self._intercept(continuation, client_call_details, request_iterator)
