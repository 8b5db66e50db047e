"""The gRPC face of the node: a thin servicer plus `create_server`.

Each method authorizes the caller (client certificate CN, optional allowlist), validates,
calls plain functions (checkpoint_store, release, budget), and maps errors:
ProtocolError -> its status + ErrorInfo; anything unexpected -> INTERNAL with a GENERIC
message (an exception text could quote held-out data, so it is never sent or logged).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protocol import PROTOCOL_VERSION, errors
from protocol.adapter_rules import ADAPTER_WEIGHTS_FILE, MAX_LORA_RANK
from protocol.errors import ProtocolError
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.generated.target_feedback.v1 import target_feedback_pb2_grpc as pb_grpc
from protocol.validation import ALLOWED_ARCHITECTURES, ALLOWED_JSON_FILES, MAX_CHUNK_BYTES
from target_owner_node.config import PER_EXAMPLE, OwnerConfig, is_loopback, split_address
from target_owner_node.evaluate_request import parse_evaluate_request
from target_owner_node.logs import log_event
from target_owner_node.metrics import MetricsEndpoint, OwnerMetrics, serve_metrics
from target_owner_node.node import OwnerNode, open_node
from target_owner_node.release import ReleaseResult

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["TargetFeedbackService"].full_name
# Room for one 1 MiB chunk plus the message framing (name, offset, protobuf tags).
MAX_RECEIVE_MESSAGE_BYTES = MAX_CHUNK_BYTES + 64 * 1024
INSECURE_IDENTITY = "insecure-loopback"
# errors.py has no generic-internal reason; unexpected failures reuse EVALUATION_FAILED.
INTERNAL_REASON = errors.EVALUATION_FAILED


@dataclass(frozen=True)
class Unparseable:
    """Stands in for a request message whose bytes do not parse (see `lenient_parser`)."""

    message_type: str


def lenient_parser(message_class: Any) -> Callable[[bytes], Any]:
    """A request deserializer that never raises.

    grpc answers a deserializer exception with its own INTERNAL and no ErrorInfo; parsing to
    `Unparseable` instead lets the servicer refuse the call as INVALID_ARGUMENT with a reason.
    """

    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except Exception:  # noqa: BLE001 - DecodeError and friends: the bytes are not this message
            return Unparseable(message_class.DESCRIPTOR.full_name)

    return parse


def parsed(message: Any) -> Any:
    """`message`, or INVALID_ARGUMENT when its bytes did not parse."""
    if isinstance(message, Unparseable):
        raise ProtocolError(
            grpc.StatusCode.INVALID_ARGUMENT,
            errors.INVALID_REQUEST,
            f"the request bytes do not parse as {message.message_type}",
        )
    return message


def add_servicer(servicer: TargetFeedbackServicer, server: grpc.Server) -> None:
    """Register the service with lenient request parsing (the generated helper's deserializers raise)."""
    unary = grpc.unary_unary_rpc_method_handler
    handlers = {
        "GetInfo": unary(servicer.GetInfo, lenient_parser(pb.GetInfoRequest), pb.GetInfoResponse.SerializeToString),
        "UploadCheckpoint": grpc.stream_unary_rpc_method_handler(
            servicer.UploadCheckpoint,
            lenient_parser(pb.UploadCheckpointRequest),
            pb.UploadCheckpointResponse.SerializeToString,
        ),
        "Evaluate": unary(servicer.Evaluate, lenient_parser(pb.EvaluateRequest), pb.EvaluateResponse.SerializeToString),
        "GetBudget": unary(
            servicer.GetBudget, lenient_parser(pb.GetBudgetRequest), pb.GetBudgetResponse.SerializeToString
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))


def _peer_identity(context: grpc.ServicerContext) -> str | None:
    from protocol.tls import peer_identity

    return peer_identity(context)


class TargetFeedbackServicer(pb_grpc.TargetFeedbackServiceServicer):
    def __init__(self, node: OwnerNode, metrics: OwnerMetrics | None = None) -> None:
        self.node = node
        self.config = node.config
        self.metrics = metrics or node.releases.metrics
        self.shutting_down = threading.Event()

    # -- plumbing --------------------------------------------------------------------------
    def _authorize(self, context: grpc.ServicerContext) -> str:
        if self.config.server.insecure:
            return INSECURE_IDENTITY
        identity = _peer_identity(context)
        if not identity:
            raise ProtocolError(
                grpc.StatusCode.UNAUTHENTICATED,
                errors.CLIENT_NOT_AUTHENTICATED,
                "a client certificate signed by the owner's CA is required",
            )
        allowed = self.config.access.allowed_clients
        if allowed is not None and identity not in allowed:
            raise ProtocolError(
                grpc.StatusCode.PERMISSION_DENIED,
                errors.CLIENT_NOT_ALLOWED,
                f"client {identity!r} is not on this node's allowlist; ask the owner to add it",
            )
        return identity

    def _handle(self, method: str, context: grpc.ServicerContext, body: Callable[[str], Any]) -> Any:
        started = time.monotonic()
        client = None
        try:
            if self.shutting_down.is_set():
                raise ProtocolError(
                    grpc.StatusCode.UNAVAILABLE,
                    errors.SHUTTING_DOWN,
                    "the node is shutting down; retry later",
                )
            client = self._authorize(context)
            response = body(client)
            seconds = time.monotonic() - started
            log_event("rpc", method=method, client=client, ok=True, seconds=round(seconds, 3))
            self.metrics.observe_rpc(method, "OK", seconds)
            return response
        except ProtocolError as error:
            status_error = error
        except Exception as error:  # noqa: BLE001 - mapped to a generic INTERNAL, text never sent
            log_event("rpc_internal_error", method=method, client=client, type=type(error).__name__)
            status_error = ProtocolError(
                grpc.StatusCode.INTERNAL, INTERNAL_REASON, "internal error on the target owner's node"
            )
        log_event(
            "rpc",
            method=method,
            client=client,
            ok=False,
            code=status_error.code.name,
            reason=status_error.reason,
            seconds=round(time.monotonic() - started, 3),
        )
        self.metrics.observe_rpc(method, status_error.code.name, time.monotonic() - started)
        context.abort_with_status(status_error.to_status())

    # -- methods ---------------------------------------------------------------------------
    def GetInfo(self, request: pb.GetInfoRequest, context: grpc.ServicerContext) -> pb.GetInfoResponse:
        return self._handle("GetInfo", context, lambda client: info_response(self.node, parsed(request)))

    def UploadCheckpoint(
        self, request_iterator, context: grpc.ServicerContext
    ) -> pb.UploadCheckpointResponse:
        def body(client: str) -> pb.UploadCheckpointResponse:
            result = self.node.store.receive(parsed(message) for message in request_iterator)
            manifest = self.node.store.manifest(result.checkpoint_id)
            self.node.audit.append(
                "upload",
                client=client,
                checkpoint_id=result.checkpoint_id,
                files=[[e.name, e.size, e.sha256] for e in manifest],
                bytes_received=result.bytes_received,
                reused_files=list(result.reused_files),
            )
            log_event(
                "upload",
                client=client,
                checkpoint_id=result.checkpoint_id,
                bytes_received=result.bytes_received,
                reused=len(result.reused_files),
            )
            self.metrics.observe_upload(result.bytes_received)
            return pb.UploadCheckpointResponse(
                checkpoint_id=result.checkpoint_id,
                bytes_received=result.bytes_received,
                reused_files=list(result.reused_files),
            )

        return self._handle("UploadCheckpoint", context, body)

    def Evaluate(self, request: pb.EvaluateRequest, context: grpc.ServicerContext) -> pb.EvaluateResponse:
        def body(client: str) -> pb.EvaluateResponse:
            inputs = parse_evaluate_request(
                parsed(request),
                self.config.evaluation,
                self.node.facts.test_domains is not None,
                self.node.store.exists,
                self.node.store.context_length,
            )
            return evaluate_response(self.node.releases.evaluate(client, inputs))

        return self._handle("Evaluate", context, body)

    def GetBudget(self, request: pb.GetBudgetRequest, context: grpc.ServicerContext) -> pb.GetBudgetResponse:
        return self._handle(
            "GetBudget", context, lambda client: budget_response(self.node, client, parsed(request))
        )


# -- responses (plain functions of public state) ---------------------------------------------
def info_response(node: OwnerNode, request: pb.GetInfoRequest | None = None) -> pb.GetInfoResponse:
    config, facts = node.config, node.facts
    privacy = config.privacy
    releases = node.releases
    privacy_pb = pb.PrivacyParameters(enabled=privacy.enabled, expected_sample_size=float(facts.heldout_size))
    if privacy.enabled:
        privacy_pb = pb.PrivacyParameters(
            enabled=True,
            epsilon_budget=privacy.epsilon_budget,
            delta=privacy.delta,
            planned_releases=privacy.planned_releases,
            sample_rate=privacy.sample_rate,
            noise_multiplier=node.noise_multiplier,
            accountant=privacy.accountant,
            expected_sample_size=releases.expected_size,
            noise_std=releases.noise_std,
            per_client_epsilon_cap=privacy.per_client_epsilon_cap,
            rows_per_query=releases.rows_per_query,
            row_cap_tail=privacy.row_cap_tail,
        )
    evaluation = config.evaluation
    verifier_kind, verifier_name = declared_verifier(config.data.verifier)
    rendering = config.data.rendering()
    return pb.GetInfoResponse(
        protocol_version=PROTOCOL_VERSION,
        task_description=config.data.task_description,
        answer_format=config.data.answer_format,
        verifier_kind=verifier_kind,
        verifier_name=verifier_name,
        heldout_size=facts.heldout_size,
        privacy=privacy_pb,
        decoding_limits=pb.DecodingLimits(
            max_new_tokens=evaluation.max_new_tokens,
            max_samples_per_prompt=evaluation.max_samples_per_prompt,
            max_candidates_per_query=evaluation.max_candidates_per_query,
            max_prompt_tokens=evaluation.max_prompt_tokens,
        ),
        upload_limits=pb.UploadLimits(
            max_checkpoint_bytes=config.storage.max_checkpoint_bytes,
            max_chunk_bytes=MAX_CHUNK_BYTES,
            allowed_architectures=list(ALLOWED_ARCHITECTURES),
            allowed_file_names=sorted(ALLOWED_JSON_FILES)
            + ["model.safetensors", "model-NNNNN-of-NNNNN.safetensors", ADAPTER_WEIGHTS_FILE],
        ),
        delta_support=pb.DeltaSupport(
            tensor_shards=True,  # stored file by file; the worker applies changed files in place
            lora_adapters=True,  # protocol.adapter_rules at upload; worker.AppliedAdapter at evaluation
            max_lora_rank=MAX_LORA_RANK,
            max_adapter_bytes=node.store.max_adapter_bytes,
        ),
        prompt_template=rendering.prompt_template,
        chat_template=rendering.chat_template,
        chat_format=rendering.chat_format,
        test_split_enabled=facts.test_domains is not None,
        test_size=facts.test_size,
        test_domains=list(facts.declared_test_domains),
        release_kinds=[pb.RELEASE_KIND_ACCURACY]
        + ([pb.RELEASE_KIND_ACCURACY_DIFFERENCE] if evaluation.difference_metrics else []),
        difference_support=pb.DifferenceSupport(
            metrics=list(evaluation.difference_metrics),
            max_clip=evaluation.max_difference_clip,
            answer_template=config.data.answer_template,
        ) if evaluation.difference_metrics else None,
    )


def declared_verifier(setting: str) -> tuple[int, str]:
    """(VerifierKind, verifier_name) for GetInfo: PER_EXAMPLE with no name, or the verifier's own
    kind (a capability of its class; plug-ins are VERIFIER_KIND_NAMED) and its registered name."""
    from rlvr_core.verifiers import VERIFIERS

    if setting == PER_EXAMPLE:
        return pb.VERIFIER_KIND_PER_EXAMPLE, ""
    kind = getattr(VERIFIERS.get(setting), "info_kind", "")
    value = pb.VerifierKind.Value(kind) if kind in set(pb.VerifierKind.keys()) else pb.VERIFIER_KIND_NAMED
    if value in (pb.VERIFIER_KIND_UNSPECIFIED, pb.VERIFIER_KIND_PER_EXAMPLE):  # not a claim one verifier can make
        value = pb.VERIFIER_KIND_NAMED
    return value, setting


def evaluate_response(result: ReleaseResult) -> pb.EvaluateResponse:
    domains = result.domain_accuracy or tuple({} for _ in result.values)
    difference = result.release.is_difference
    field = "accuracy_difference" if difference else "accuracy"
    return pb.EvaluateResponse(
        kind=pb.RELEASE_KIND_ACCURACY_DIFFERENCE if difference else pb.RELEASE_KIND_ACCURACY,
        results=[
            pb.CandidateResult(checkpoint_id=cid, domain_accuracy=domain, **{field: value})
            for cid, value, domain in zip(result.valued_ids, result.values, domains, strict=True)
        ],
        privacy=pb.PrivacySpend(
            noise_std=result.noise_std,
            epsilon_this_release=result.epsilon_this_release,
            epsilon_spent_total=result.epsilon_spent_total,
            epsilon_remaining=result.epsilon_remaining,
            delta=result.delta,
        ),
        release_id=result.release_id,
    )


def budget_response(
    node: OwnerNode, client: str, request: pb.GetBudgetRequest | None = None
) -> pb.GetBudgetResponse:
    budget = node.budget
    if budget is None:
        return pb.GetBudgetResponse(dp_enabled=False)
    privacy = budget.privacy
    return pb.GetBudgetResponse(
        dp_enabled=True,
        epsilon_budget=privacy.epsilon_budget,
        epsilon_spent=budget.spent(),
        epsilon_remaining=budget.remaining(),
        delta=privacy.delta,
        releases_made=budget.releases_made,
        releases_remaining_estimate=budget.releases_remaining_estimate(),
        client_epsilon_spent=budget.client_spent(client),
        client_epsilon_cap=privacy.per_client_epsilon_cap,
    )


# -- server ---------------------------------------------------------------------------------
@dataclass
class RunningServer:
    """A started server and what is needed to drain it."""

    server: grpc.Server
    port: int
    node: OwnerNode
    servicer: TargetFeedbackServicer
    health: health.HealthServicer
    metrics: OwnerMetrics | None = None
    metrics_endpoint: MetricsEndpoint | None = None
    health_server: grpc.Server | None = None  # the optional plaintext health-only port
    health_port: int | None = None

    def shutdown(self, grace_s: float | None = None, drain_delay_s: float | None = None) -> None:
        """Report NOT_SERVING, refuse new calls, let in-flight calls finish, stop the worker."""
        settings = self.node.config.server
        grace_s = settings.shutdown_grace_s if grace_s is None else grace_s
        drain_delay_s = settings.drain_delay_s if drain_delay_s is None else drain_delay_s
        self.servicer.shutting_down.set()
        self.health.enter_graceful_shutdown()
        log_event("shutting_down", grace_s=grace_s)
        if drain_delay_s > 0:
            time.sleep(drain_delay_s)  # lets health checkers see NOT_SERVING before the port closes
        self.server.stop(grace_s).wait()
        if self.health_server is not None:
            self.health_server.stop(0).wait()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        self.node.close()
        log_event("stopped")


def _server_credentials(config: OwnerConfig) -> grpc.ServerCredentials:
    from protocol.tls import server_credentials

    tls = config.tls
    return server_credentials(
        tls.ca_cert.read_bytes(),
        tls.server_cert.read_bytes(),
        tls.server_key.read_bytes(),
        require_client_auth=tls.require_client_auth,
    )


def start_server(
    config: OwnerConfig,
    address: str | None = None,
    *,
    scorer: Any = None,
    random_source: Any = None,
    metrics: OwnerMetrics | None = None,
) -> RunningServer:
    """Open the node (all startup checks), bind `address` (default: config) and start serving.

    Also starts, when configured, the plaintext health-only port (server.health_address) and
    the Prometheus endpoint ([metrics] port)."""
    address = address or config.server.listen_address
    if config.server.insecure and not is_loopback(split_address(address)[0]):
        raise ValueError(f"server.insecure: plaintext is only allowed on loopback addresses; got {address!r}")
    node = open_node(config, scorer=scorer, random_source=random_source)
    metrics = metrics or OwnerMetrics()
    node.releases.metrics = metrics
    metrics.set_budget(node.budget)
    server = health_server = metrics_endpoint = None
    health_port = None
    try:
        interceptors = []
        if not config.server.insecure:
            from protocol.tls import ClientCertificatePolicy

            # Checks clientAuth usage and validity on every call, and the CN allowlist.
            interceptors.append(ClientCertificatePolicy(config.access.allowed_clients))
        server = grpc.server(
            _executor(config.server.max_workers),
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        servicer = TargetFeedbackServicer(node, metrics)
        add_servicer(servicer, server)
        health_servicer = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        if config.server.insecure:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, _server_credentials(config))
        if port == 0:
            raise OSError(f"could not bind {address}")
        server.start()
        if config.server.health_address is not None:
            health_server, health_port = _health_only_server(config.server.health_address, health_servicer)
        if config.metrics.port is not None:
            metrics_endpoint = serve_metrics(metrics, config.metrics.host, config.metrics.port)
    except BaseException:
        for started in (health_server, server):
            if started is not None:
                started.stop(0)
        if metrics_endpoint is not None:
            metrics_endpoint.close()
        node.close()
        raise
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log_event(
        "listening",
        address=address,
        port=port,
        heldout_size=node.facts.heldout_size,
        dp=config.privacy.enabled,
        noise_multiplier=node.noise_multiplier,
        health_port=health_port,
        metrics_port=metrics_endpoint.port if metrics_endpoint else None,
    )
    return RunningServer(
        server, port, node, servicer, health_servicer, metrics, metrics_endpoint, health_server, health_port
    )


def _health_only_server(address: str, health_servicer: health.HealthServicer) -> tuple[grpc.Server, int]:
    """A plaintext server with ONLY grpc.health.v1, sharing the main server's health state.

    Container health checks run inside the owner's container and hold no client
    certificate, so they cannot use the mTLS port; this port answers nothing else."""
    from concurrent.futures import ThreadPoolExecutor

    server = grpc.server(
        ThreadPoolExecutor(max_workers=2, thread_name_prefix="owner-health"), options=[("grpc.so_reuseport", 0)]
    )
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind server.health_address {address}")
    server.start()
    return server, port


def create_server(config: OwnerConfig, address: str | None = None, **kwargs: Any) -> tuple[grpc.Server, int]:
    """gRPC-example style entry: a started server and its bound port (use port 0 in tests)."""
    running = start_server(config, address, **kwargs)
    return running.server, running.port


def _executor(max_workers: int):
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="owner-rpc")
