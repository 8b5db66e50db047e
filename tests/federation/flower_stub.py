"""The conformance suite's RPC-level checks through the Flower path: a TargetFeedbackServiceStub
look-alike whose GetInfo, GetBudget and Evaluate travel as Flower messages through the shim
(flower_shim/) to the owner, and whose errors are the owner's own status, forwarded verbatim.

UploadCheckpoint stays on the direct port: the suite's upload checks send deliberately malformed
streams (chunks, manifests), which are transport checks; the Flower path carries files and a manifest.
Every reply is recorded into the suite's Recorder, so the leak checks scan what came through Flower.
"""

from __future__ import annotations

from typing import Any

import grpc
from flwr.app import ConfigRecord, Message, RecordDict

from protocol import federation_wire as wire
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

SERVICE = "/target_feedback.v1.TargetFeedbackService/"


class ForwardedError(grpc.RpcError):
    """The owner's failed call, as the shim forwarded it (code, message, google.rpc.Status trailer)."""

    def __init__(self, code: grpc.StatusCode, message: str, status: bytes):
        super().__init__(message)
        self._code, self._message, self._status = code, message, status

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def initial_metadata(self) -> tuple:
        return ()

    def trailing_metadata(self) -> tuple:
        return (("grpc-status-details-bin", self._status),) if self._status else ()


class _Outcome:
    def __init__(self, result: Any = None, error: BaseException | None = None):
        self._result, self._error = result, error

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> Any:
        return self._result

    def initial_metadata(self) -> tuple:
        return ()

    def trailing_metadata(self) -> tuple:
        return ()


class FlowerStub:
    def __init__(self, grid: Any, node_id: int, direct_stub: Any, recorder: Any):
        self.grid, self.node_id, self.direct, self.recorder = grid, node_id, direct_stub, recorder

    def _call(self, method: str, action: str, records: dict[str, Any], response_type: Any) -> Any:
        message = Message(RecordDict(records), dst_node_id=self.node_id, message_type=f"query.{action}")
        reply = next(iter(self.grid.send_and_receive([message])))
        if reply.has_error():
            error: BaseException = ForwardedError(grpc.StatusCode.UNAVAILABLE, f"Flower error {reply.error.code}", b"")
        elif wire.ERROR_RECORD in reply.content.config_records:
            record = reply.content.config_records[wire.ERROR_RECORD]
            error = ForwardedError(grpc.StatusCode[str(record["code"])], str(record["message"]), bytes(record["status"]))
        else:
            response = response_type.FromString(reply.content.config_records[wire.REPLY_RECORD]["response"])
            self.recorder.record_call(SERVICE + method, _Outcome(result=response))
            return response
        self.recorder.record_call(SERVICE + method, _Outcome(error=error))
        raise error

    def GetInfo(self, request: pb.GetInfoRequest, timeout: float | None = None) -> pb.GetInfoResponse:
        return self._call("GetInfo", "info", {}, pb.GetInfoResponse)

    def GetBudget(self, request: pb.GetBudgetRequest, timeout: float | None = None) -> pb.GetBudgetResponse:
        return self._call("GetBudget", "budget", {}, pb.GetBudgetResponse)

    def Evaluate(self, request: pb.EvaluateRequest, timeout: float | None = None) -> pb.EvaluateResponse:
        records = {"request": ConfigRecord({wire.EVALUATE_REQUEST_KEY: request.SerializeToString()})}
        return self._call("Evaluate", "evaluate", records, pb.EvaluateResponse)

    def UploadCheckpoint(self, requests: Any, timeout: float | None = None) -> pb.UploadCheckpointResponse:
        return self.direct.UploadCheckpoint(requests, timeout=timeout)
