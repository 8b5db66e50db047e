"""The shim ClientApp: one handler per public RPC (`query.info|budget|upload|evaluate`).

Each message is checked against protocol/federation_wire.py's schema first: an unknown action
(e.g. a request for per-example data, which no public RPC serves), an unknown record or key, or
an EvaluateRequest with fields this protocol does not define is refused before the owner is
called. The owner's answer, or its gRPC error (code, reason, message: what the owner's server
already chose to send), goes back as records; nothing local (paths, node config, tracebacks) is
added. Every message opens its own channel: in a deployment each message is a new ClientApp
process (docs/FLOWER.md).

Where the owner is: `resolve(context)` returns (owner name, PublicClientSettings). A deployment
reads it from the SuperNode's node_config (`settings_from_node_config`: addresses and the
client certificate's paths, never a data path); the simulation passes a table by partition id.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

import grpc
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from google.protobuf import unknown_fields

from protocol import federation_wire as wire
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.public_client import PublicClientSettings, PublicOwnerClient, describe_error

Resolver = Callable[[Context], tuple[str, PublicClientSettings]]
REFUSED_REASON = "FEDERATION_MESSAGE_REFUSED"
SHIM_FAILED_REASON = "FEDERATION_SHIM_FAILED"
NODE_CONFIG_KEYS = ("owner-name", "owner-address", "owner-ca", "owner-cert", "owner-key", "owner-server-name")


def settings_from_node_config(context: Context) -> tuple[str, PublicClientSettings]:
    """A deployment's resolver: the SuperNode's --node-config names the owner and its loopback
    port and the client certificate's files (paths only; the ClientApp can read node_config)."""
    config = context.node_config
    missing = [key for key in NODE_CONFIG_KEYS[:5] if key not in config]
    if missing:
        raise ValueError(f"flower-supernode --node-config lacks {', '.join(missing)} (docs/FLOWER.md)")
    return str(config["owner-name"]), PublicClientSettings(
        target=str(config["owner-address"]), ca_cert=Path(str(config["owner-ca"])),
        client_cert=Path(str(config["owner-cert"])), client_key=Path(str(config["owner-key"])),
        server_name=str(config["owner-server-name"]) if "owner-server-name" in config else None)


def record_kinds(content: RecordDict) -> tuple[dict[str, str], dict[str, set[str]]]:
    kinds: dict[str, str] = {}
    keys: dict[str, set[str]] = {}
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            kinds[name] = "array"
        elif isinstance(record, ConfigRecord):
            kinds[name] = "config"
            keys[name] = set(record.keys())
        elif isinstance(record, MetricRecord):
            kinds[name] = "metric"
        else:
            kinds[name] = type(record).__name__
    return kinds, keys


def reply(message: Message, **values: Any) -> Message:
    return Message(RecordDict({wire.REPLY_RECORD: ConfigRecord(values)}), reply_to=message)


def error_reply(message: Message, code: str, reason: str, text: str, status: bytes = b"") -> Message:
    """The owner's error as it sent it (code, ErrorInfo reason, message and its google.rpc.Status
    trailer), or the shim's own refusal (no status)."""
    return Message(RecordDict({wire.ERROR_RECORD: ConfigRecord(
        {"code": code, "reason": reason, "message": text, "status": status})}), reply_to=message)


def parse_evaluate_request(data: bytes) -> pb.EvaluateRequest:
    request = pb.EvaluateRequest()
    try:
        request.ParseFromString(data)
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise wire.WireError(f"query.evaluate: not an EvaluateRequest ({type(error).__name__})") from None
    if len(unknown_fields.UnknownFieldSet(request)) or len(unknown_fields.UnknownFieldSet(request.decoding)):
        raise wire.WireError("query.evaluate: the EvaluateRequest carries fields target_feedback.v1 does not define")
    return request


def forward(action: str, message: Message, owner: PublicOwnerClient, name: str) -> Message:
    """One public RPC for one checked message."""
    content = message.content
    if action == "info":
        return reply(message, response=owner.get_info().SerializeToString(), owner=name)
    if action == "budget":
        return reply(message, response=owner.get_budget().SerializeToString())
    if action == "evaluate":
        request = parse_evaluate_request(content.config_records["request"][wire.EVALUATE_REQUEST_KEY])
        return reply(message, response=owner.evaluate(request).SerializeToString())
    arrays = {key: array.numpy() for key, array in content.array_records["tensors"].items()}
    files = dict(content.config_records["files"])
    # A private scratch folder for the checkpoint being forwarded: the shim's own temp, never the owner's.
    # The files the owner already holds are in the manifest only: the owner's intake fills them.
    with tempfile.TemporaryDirectory(prefix="flower-shim-") as scratch:
        manifest = wire.decode_checkpoint(arrays, files, Path(scratch))
        response = owner.upload(Path(scratch), manifest)
        return reply(message, checkpoint_id=response.checkpoint_id, bytes_received=int(response.bytes_received))


def make_client_app(resolve: Resolver = settings_from_node_config) -> ClientApp:
    app = ClientApp()

    def handler(action: str) -> Callable[[Message, Context], Message]:
        def handle(message: Message, context: Context) -> Message:
            kinds, keys = record_kinds(message.content) if message.has_content() else ({}, {})
            try:
                wire.check_request(action, kinds, keys)
                name, settings = resolve(context)
                with PublicOwnerClient(settings) as owner:
                    return forward(action, message, owner, name)
            except wire.WireError as error:
                return error_reply(message, grpc.StatusCode.INVALID_ARGUMENT.name, REFUSED_REASON, str(error))
            except grpc.RpcError as error:
                return error_reply(message, *describe_error(error))
            except Exception as error:  # noqa: BLE001 - a traceback would reach the trainer (and Ray's names paths)
                return error_reply(message, grpc.StatusCode.INTERNAL.name, SHIM_FAILED_REASON,
                                   f"the shim could not forward query.{action} ({type(error).__name__})")

        handle.__name__ = f"query_{action}"
        return handle

    for action in wire.ACTIONS:
        app.query(action)(handler(action))
    return app


# What a deployment's FAB names as its clientapp component (docs/FLOWER.md).
app = make_client_app()
