"""The owner's public RPCs, and nothing else: a minimal mTLS gRPC client for code that must not
import either node (the Flower shim, flower_shim/, which runs trainer-submitted code at an owner).

It offers exactly the four calls of target_feedback.v1 (GetInfo, GetBudget, UploadCheckpoint,
Evaluate) on a checkpoint folder (with an optional manifest: content-address reuse) and serialized requests, with one deadline per call and no
retries: a caller that wants retries (the trainer's TargetFeedbackClient) has its own. Errors
stay grpc.RpcError; `describe_error` turns one into the (code, reason, message) triple the
owner's server already chose to send, so a forwarder adds nothing of its own to it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import grpc

from protocol import errors
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.generated.target_feedback.v1 import target_feedback_pb2_grpc as pb_grpc
from protocol.validation import MAX_CHUNK_BYTES, is_allowed_file_name, sha256_file


@dataclass(frozen=True)
class PublicClientSettings:
    """Where the owner's node listens and the mTLS client identity it authorizes. No data path:
    whoever holds these settings can do only what the owner's public RPCs allow."""

    target: str                      # host:port, normally loopback
    ca_cert: Path
    client_cert: Path
    client_key: Path
    server_name: str | None = None   # TLS name override when target is an IP not in the certificate
    deadline_s: float = 600.0


class PublicOwnerClient:
    """One channel to one owner's node, opened per use (`with PublicOwnerClient(...) as c:`)."""

    def __init__(self, settings: PublicClientSettings):
        self.settings = settings
        credentials = grpc.ssl_channel_credentials(
            root_certificates=Path(settings.ca_cert).read_bytes(),
            private_key=Path(settings.client_key).read_bytes(),
            certificate_chain=Path(settings.client_cert).read_bytes(),
        )
        options = [("grpc.max_send_message_length", 4 * MAX_CHUNK_BYTES),
                   ("grpc.max_receive_message_length", 4 * MAX_CHUNK_BYTES)]
        if settings.server_name:
            options.append(("grpc.ssl_target_name_override", settings.server_name))
        self._channel = grpc.secure_channel(settings.target, credentials, options=options)
        self._stub = pb_grpc.TargetFeedbackServiceStub(self._channel)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._channel.close()

    def get_info(self) -> pb.GetInfoResponse:
        return self._stub.GetInfo(pb.GetInfoRequest(), timeout=self.settings.deadline_s)

    def get_budget(self) -> pb.GetBudgetResponse:
        return self._stub.GetBudget(pb.GetBudgetRequest(), timeout=self.settings.deadline_s)

    def evaluate(self, request: pb.EvaluateRequest) -> pb.EvaluateResponse:
        return self._stub.Evaluate(request, timeout=self.settings.deadline_s)

    def upload(self, folder: Path, manifest: Sequence[tuple[str, int, str]] | None = None) -> pb.UploadCheckpointResponse:
        """Stream a checkpoint (manifest first); the reply has its id and the bytes the owner received.

        `manifest` ((name, size, sha256) of every file) may list files that `folder` lacks: those are
        files the owner already holds by content, so no chunk is sent for them and the owner fills
        them from its store (or refuses with MISSING_FILE_DATA). Without it, every allowlisted file of
        `folder` is listed and sent."""
        folder = Path(folder)
        present = sorted(p.name for p in folder.iterdir() if p.is_file())
        refused = [name for name in present if not is_allowed_file_name(name)]
        if manifest is None:
            manifest = [(name, (folder / name).stat().st_size, sha256_file(folder / name)) for name in present]
        unlisted = sorted(set(present) - {name for name, _, _ in manifest})
        if refused:
            raise ValueError(f"{folder}: not allowed: {', '.join(refused)}")
        if unlisted or not manifest:
            raise ValueError(f"{folder}: " + (f"not in the manifest: {', '.join(unlisted)}" if unlisted else "no files"))
        entries = [pb.FileEntry(name=name, size=size, sha256=sha) for name, size, sha in manifest]
        sent = [name for name, _, _ in manifest if name in present]

        def requests() -> Iterator[pb.UploadCheckpointRequest]:
            yield pb.UploadCheckpointRequest(manifest=pb.CheckpointManifest(files=entries))
            for name in sent:
                with open(folder / name, "rb") as fh:
                    offset = 0
                    while block := fh.read(MAX_CHUNK_BYTES):
                        yield pb.UploadCheckpointRequest(chunk=pb.FileChunk(name=name, offset=offset, data=block))
                        offset += len(block)

        return self._stub.UploadCheckpoint(requests(), timeout=self.settings.deadline_s)


STATUS_DETAILS_KEY = "grpc-status-details-bin"


def describe_error(error: grpc.RpcError) -> tuple[str, str, str, bytes]:
    """(status code name, ErrorInfo reason or "", details, the google.rpc.Status trailer or b""):
    what the owner's server sent, verbatim."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    status = next((value for key, value in trailing or () if key == STATUS_DETAILS_KEY), b"")
    return (code.name, errors.reason_of(error) or "", (error.details() or "") if hasattr(error, "details") else "",
            status if isinstance(status, bytes) else b"")


