"""Every error reason of the protocol, in one place (Google AIP-193).

A failing RPC carries a gRPC status code plus one google.rpc.ErrorInfo whose `reason` is
one of the constants below and whose `domain` is ERROR_DOMAIN. Clients branch on the
reason, never on message text. Messages must never contain held-out data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

ERROR_DOMAIN = "target-feedback.v1"

# INVALID_ARGUMENT
INVALID_REQUEST = "INVALID_REQUEST"
INVALID_CHECKPOINT = "INVALID_CHECKPOINT"
DISALLOWED_FILE = "DISALLOWED_FILE"
CHECKSUM_MISMATCH = "CHECKSUM_MISMATCH"
UPLOAD_TOO_LARGE = "UPLOAD_TOO_LARGE"
UNKNOWN_CHECKPOINT = "UNKNOWN_CHECKPOINT"
MISSING_FILE_DATA = "MISSING_FILE_DATA"
DECODING_OUT_OF_LIMITS = "DECODING_OUT_OF_LIMITS"
TEST_SPLIT_DISABLED = "TEST_SPLIT_DISABLED"
RELEASE_KIND_NOT_SERVED = "RELEASE_KIND_NOT_SERVED"
# UNAUTHENTICATED / PERMISSION_DENIED
CLIENT_NOT_AUTHENTICATED = "CLIENT_NOT_AUTHENTICATED"
CLIENT_NOT_ALLOWED = "CLIENT_NOT_ALLOWED"
# RESOURCE_EXHAUSTED (never retry)
PRIVACY_BUDGET_EXHAUSTED = "PRIVACY_BUDGET_EXHAUSTED"
CLIENT_BUDGET_EXHAUSTED = "CLIENT_BUDGET_EXHAUSTED"
STORAGE_QUOTA_EXCEEDED = "STORAGE_QUOTA_EXCEEDED"
# UNAVAILABLE / INTERNAL
SHUTTING_DOWN = "SHUTTING_DOWN"
EVALUATION_FAILED = "EVALUATION_FAILED"

# Reasons after which the same request must not be retried.
NON_RETRYABLE = frozenset({PRIVACY_BUDGET_EXHAUSTED, CLIENT_BUDGET_EXHAUSTED, STORAGE_QUOTA_EXCEEDED})


@dataclass
class ProtocolError(Exception):
    """An error that maps to one gRPC status. `message` must be free of held-out data."""

    code: grpc.StatusCode
    reason: str
    message: str
    metadata: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code.name} {self.reason}: {self.message}"

    def to_status(self) -> grpc.Status:
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=ERROR_DOMAIN, metadata=self.metadata)
        detail = any_pb2.Any()
        detail.Pack(info)
        status = status_pb2.Status(code=self.code.value[0], message=self.message, details=[detail])
        return rpc_status.to_status(status)


def invalid(reason: str, message: str, **metadata: str) -> ProtocolError:
    return ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, reason, message, dict(metadata))


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo attached to a failed call, or None when the server sent none."""
    status = rpc_status.from_call(error) if hasattr(error, "trailing_metadata") else None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def reason_of(error: grpc.RpcError) -> str | None:
    info = error_info(error)
    return info.reason if info is not None else None


assert code_pb2.INVALID_ARGUMENT == grpc.StatusCode.INVALID_ARGUMENT.value[0]
