"""Channels to the server under test: the trusted mTLS identity and deliberately bad ones.

Every channel carries the suite's recording interceptor, so that every byte the server
sends (also on refused connections) reaches the leak checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protocol.conformance.recorder import Recorder
from protocol.generated.target_feedback.v1 import target_feedback_pb2_grpc as pb_grpc
from protocol.validation import MAX_CHUNK_BYTES

SERVICE_NAME = "target_feedback.v1.TargetFeedbackService"
# Room for a deliberately oversized chunk (the server must refuse it, not the client).
_MESSAGE_LIMIT = 8 * MAX_CHUNK_BYTES


@dataclass(frozen=True)
class Identity:
    """What the client presents: roots to verify the server, and an optional client cert."""

    root_ca: bytes
    cert_chain: bytes | None = None
    private_key: bytes | None = None

    @classmethod
    def from_files(cls, ca: Path, cert: Path | None = None, key: Path | None = None) -> Identity:
        return cls(
            Path(ca).read_bytes(),
            Path(cert).read_bytes() if cert else None,
            Path(key).read_bytes() if key else None,
        )


class Connection:
    """One channel plus the service and health stubs. Close it when done."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.stub = pb_grpc.TargetFeedbackServiceStub(channel)
        self.health = health_pb2_grpc.HealthStub(channel)

    def health_status(self, service: str = "", timeout: float = 5.0) -> str:
        """SERVING / NOT_SERVING / ..., or 'ERROR <code>' when the check itself fails."""
        try:
            reply = self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as error:
            return f"ERROR {error.code().name}"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _options(server_name: str | None, unique: str | None) -> list[tuple[str, object]]:
    options: list[tuple[str, object]] = [
        ("grpc.max_send_message_length", _MESSAGE_LIMIT),
        ("grpc.max_receive_message_length", _MESSAGE_LIMIT),
        ("grpc.enable_retries", 0),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    if unique:
        # A distinct channel arg keeps gRPC from sharing a subchannel (and its TLS session)
        # between channels that must be tested independently.
        options.append(("conformance.channel", unique))
    return options


def secure_connection(
    target: str, identity: Identity, recorder: Recorder, server_name: str | None = None, unique: str | None = None
) -> Connection:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=identity.root_ca, private_key=identity.private_key, certificate_chain=identity.cert_chain
    )
    channel = grpc.secure_channel(target, credentials, options=_options(server_name, unique))
    return Connection(grpc.intercept_channel(channel, recorder.interceptor()))


def plaintext_connection(target: str, recorder: Recorder, unique: str | None = None) -> Connection:
    channel = grpc.insecure_channel(target, options=_options(None, unique))
    return Connection(grpc.intercept_channel(channel, recorder.interceptor()))
