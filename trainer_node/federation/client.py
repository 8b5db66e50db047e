"""FlowerOwnerClient: an OwnerClient whose calls travel as Flower messages through a Grid.

Each call is one message `query.<action>` (protocol/federation_wire.py) to one SuperNode, sent
with `grid.send_and_receive` and a deadline. What comes back is the owner node's own reply, or
its gRPC error as a record; both map to the errors TargetFeedbackClient raises
(RESOURCE_EXHAUSTED -> BudgetExhausted, UNAUTHENTICATED/PERMISSION_DENIED -> OwnerRefused,
UNAVAILABLE -> OwnerUnavailable). A Flower-level failure (the node is gone, the shim crashed,
no reply before the deadline) is OwnerUnavailable: the feedback pieces treat it as an outage.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from protocol import errors
from protocol import federation_wire as wire
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from trainer_node.feedback.client import BudgetExhausted, FeedbackError, OwnerRefused, OwnerUnavailable

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")


def error_from_record(action: str, record: Any) -> FeedbackError:
    """The FeedbackError for the owner's error, as the shim forwarded it."""
    code_name, reason, text = str(record["code"]), str(record["reason"]) or None, str(record["message"])
    code = grpc.StatusCode.__members__.get(code_name, grpc.StatusCode.UNKNOWN)
    detail = f"{action} failed: {code_name}" + (f" {reason}" if reason else "") + f": {text}"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return BudgetExhausted(detail, code, reason)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return OwnerRefused(detail, code, reason)
    if code == grpc.StatusCode.UNAVAILABLE:
        return OwnerUnavailable(detail, code, reason)
    return FeedbackError(detail, code, reason)


class FlowerOwnerClient:
    """One owner reached through its SuperNode `node_id` on `grid` (a flwr.serverapp.Grid)."""

    def __init__(self, grid: Any, node_id: int, name: str = "", timeout_s: float = 600.0):
        self.grid = grid
        self.node_id = int(node_id)
        self.name = name
        self.timeout_s = timeout_s
        self.closed = False
        self.last_upload_bytes = 0  # what the latest upload carried
        self.upload_bytes_total = 0
        self.last_bytes_received: int | None = None  # what the owner says it received of the latest upload
        self._owner_holds: set[str] = set()  # sha256 of the files this owner stores (content addresses)

    def _ask(self, action: str, records: dict[str, Any]) -> Any:
        from flwr.app import Message, RecordDict

        if self.closed:
            raise OwnerUnavailable(f"{action}: the Flower client of owner {self.name!r} is closed")
        message = Message(RecordDict(records), dst_node_id=self.node_id,
                          message_type=f"{wire.MESSAGE_CATEGORY}.{action}", group_id=uuid.uuid4().hex,
                          ttl=self.timeout_s)
        replies = list(self.grid.send_and_receive([message], timeout=self.timeout_s))
        if not replies:
            raise OwnerUnavailable(f"{action}: no reply from owner {self.name!r} (node {self.node_id}) within "
                                   f"{self.timeout_s:g} s", grpc.StatusCode.UNAVAILABLE)
        answer = replies[0]
        if answer.has_error():
            # Flower's own failure (node unavailable, ClientApp crashed); its text may hold a
            # traceback of the shim, so only the code is kept.
            raise OwnerUnavailable(f"{action}: owner {self.name!r} (node {self.node_id}) did not answer: Flower "
                                   f"error {answer.error.code}", grpc.StatusCode.UNAVAILABLE)
        content = answer.content
        if wire.ERROR_RECORD in content.config_records:
            raise error_from_record(action, content.config_records[wire.ERROR_RECORD])
        if wire.REPLY_RECORD not in content.config_records:
            raise FeedbackError(f"{action}: owner {self.name!r} sent a reply without a {wire.REPLY_RECORD!r} record")
        return content.config_records[wire.REPLY_RECORD]

    # --- OwnerClient ----------------------------------------------------------------------

    def info(self) -> pb.GetInfoResponse:
        record = self._ask("info", {})
        if not self.name:
            self.name = str(record["owner"])
        return pb.GetInfoResponse.FromString(record["response"])

    def owner_name(self) -> str:
        """The name the owner's shim reports (its node_config in a deployment, its table in simulation)."""
        return str(self._ask("info", {})["owner"])

    def budget(self) -> pb.GetBudgetResponse:
        return pb.GetBudgetResponse.FromString(self._ask("budget", {})["response"])

    def upload(self, model_dir: Path, digests: Mapping[str, str] | None = None) -> str:
        """Send a checkpoint in one message: every file in its manifest, but only the files this
        owner does not hold yet (by sha256, as the direct client does), so per-tensor-shard
        candidates cost the changed tensors only. `digests` (file name -> sha256, from the
        candidate writer) spare hashing. If the owner lost a file it was believed to hold
        (MISSING_FILE_DATA), the upload is repeated in full. `last_upload_bytes` is what this
        upload carried (tensor and file bytes), `upload_bytes_total` the run's sum."""
        try:
            return self._upload_once(Path(model_dir), digests, self._owner_holds)
        except FeedbackError as error:
            if error.reason != errors.MISSING_FILE_DATA:
                raise
            self._owner_holds.clear()
            return self._upload_once(Path(model_dir), digests, set())

    def _upload_once(self, model_dir: Path, digests: Mapping[str, str] | None, held: set[str]) -> str:
        from flwr.app import Array, ArrayRecord, ConfigRecord

        try:
            arrays, files = wire.encode_checkpoint(model_dir, digests, held)
            manifest = wire.read_manifest(files)
        except wire.WireError as error:
            raise FeedbackError(str(error)) from None
        tensors = ArrayRecord({key: Array(array) for key, array in arrays.items()})
        record = self._ask("upload", {"tensors": tensors, "files": ConfigRecord(files)})
        self._owner_holds.update(sha for _, _, sha in manifest)
        self.last_upload_bytes = sum(a.nbytes for a in arrays.values()) + sum(len(b) for b in files.values())
        self.upload_bytes_total += self.last_upload_bytes
        self.last_bytes_received = int(record["bytes_received"]) if "bytes_received" in record else None
        return str(record["checkpoint_id"])

    def evaluate(self, checkpoint_ids: list[str], decoding: pb.DecodingSettings,
                 split: int = pb.SPLIT_FEEDBACK, request_id: str | None = None,
                 difference: pb.DifferenceRequest | None = None) -> pb.EvaluateResponse:
        from flwr.app import ConfigRecord

        kind = pb.RELEASE_KIND_ACCURACY_DIFFERENCE if difference is not None else pb.RELEASE_KIND_UNSPECIFIED
        request = pb.EvaluateRequest(checkpoint_ids=checkpoint_ids, decoding=decoding, split=split,
                                     request_id=request_id or uuid.uuid4().hex, kind=kind, difference=difference)
        record = self._ask("evaluate", {"request": ConfigRecord({wire.EVALUATE_REQUEST_KEY: request.SerializeToString()})})
        return pb.EvaluateResponse.FromString(record["response"])

    def close(self) -> None:
        self.closed = True
