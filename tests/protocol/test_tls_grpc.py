"""Mutual TLS over real loopback gRPC: who is refused, and by whom.

Measured with grpcio 1.85 (BoringSSL): the handshake refuses no certificate, a foreign
CA, an expired or not-yet-valid certificate and a serverAuth-only certificate; it accepts
a certificate WITHOUT any extendedKeyUsage, which ClientCertificatePolicy refuses.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protocol import errors
from protocol.tls import (
    ClientCertificatePolicy,
    Pki,
    channel_credentials,
    generate_ca,
    issue_certificate,
    peer_identity,
    server_credentials,
)

NOW = dt.datetime.now(dt.UTC)


@dataclass
class Bundle:
    ca: Pki
    server: Pki
    clients: dict[str, Pki | None] = field(default_factory=dict)


@pytest.fixture(scope="module")
def pki() -> Bundle:
    ca = generate_ca("owner CA")
    other_ca = generate_ca("someone else's CA")
    day = dt.timedelta(days=1)
    return Bundle(
        ca=ca,
        server=issue_certificate(ca, "localhost", "server", ["localhost", "127.0.0.1", "::1"]),
        clients={
            "valid": issue_certificate(ca, "trainer", "client"),
            "no_certificate": None,
            "other_ca": issue_certificate(other_ca, "trainer", "client"),
            "expired": issue_certificate(
                ca, "trainer", "client", not_valid_before=NOW - 10 * day, not_valid_after=NOW - day
            ),
            "not_yet_valid": issue_certificate(
                ca, "trainer", "client", not_valid_before=NOW + day, not_valid_after=NOW + 10 * day
            ),
            "server_usage_only": issue_certificate(ca, "trainer", "server", ["trainer"]),
            "no_usage_extension": issue_certificate(ca, "trainer", "client", omit_extended_key_usage=True),
            "valid_other_name": issue_certificate(ca, "mallory", "client"),
        },
    )


class RecordingHealth(health.HealthServicer):
    """A trivial service that remembers who called it."""

    def __init__(self) -> None:
        super().__init__()
        self.identities: list[str | None] = []

    def Check(self, request, context):
        self.identities.append(peer_identity(context))
        return super().Check(request, context)


@dataclass
class Server:
    port: int
    servicer: RecordingHealth


def _serve(pki: Bundle, interceptors: list[grpc.ServerInterceptor]) -> Iterator[Server]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=interceptors)
    servicer = RecordingHealth()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    # Raw-bytes streaming methods: the policy must guard every handler kind.
    streaming = {
        "Collect": grpc.stream_unary_rpc_method_handler(lambda chunks, context: b"".join(chunks)),
        "Echo": grpc.stream_stream_rpc_method_handler(lambda chunks, context: iter(list(chunks))),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Bytes", streaming),))
    port = server.add_secure_port(
        "127.0.0.1:0", server_credentials(pki.ca.cert_pem, pki.server.cert_pem, pki.server.key_pem)
    )
    server.start()
    try:
        yield Server(port, servicer)
    finally:
        server.stop(0)


@pytest.fixture(scope="module")
def plain_server(pki: Bundle) -> Iterator[Server]:
    yield from _serve(pki, [])


@pytest.fixture(scope="module")
def policy_server(pki: Bundle) -> Iterator[Server]:
    yield from _serve(pki, [ClientCertificatePolicy(allowed_identities={"trainer"})])


def _channel(pki: Bundle, port: int, client: str, host: str = "127.0.0.1") -> grpc.Channel:
    credentials = pki.clients[client]
    creds = channel_credentials(
        pki.ca.cert_pem,
        credentials.cert_pem if credentials else None,
        credentials.key_pem if credentials else None,
    )
    return grpc.secure_channel(f"{host}:{port}", creds)


def _call(pki: Bundle, port: int, client: str, host: str = "127.0.0.1") -> health_pb2.HealthCheckResponse:
    with _channel(pki, port, client, host) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_valid_client_is_accepted_and_identified(pki: Bundle, policy_server: Server, host: str) -> None:
    response = _call(pki, policy_server.port, "valid", host)
    assert response.status == health_pb2.HealthCheckResponse.SERVING
    assert policy_server.servicer.identities[-1] == "trainer"


HANDSHAKE_REFUSED = ["no_certificate", "other_ca", "expired", "not_yet_valid", "server_usage_only"]


@pytest.mark.parametrize("client", HANDSHAKE_REFUSED)
@pytest.mark.parametrize("server_kind", ["plain_server", "policy_server"])
def test_handshake_refuses(
    pki: Bundle, client: str, server_kind: str, request: pytest.FixtureRequest
) -> None:
    server: Server = request.getfixturevalue(server_kind)
    calls_before = len(server.servicer.identities)
    with pytest.raises(grpc.RpcError) as caught:
        _call(pki, server.port, client)
    # A failed handshake never reaches the application: the client only sees UNAVAILABLE.
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(server.servicer.identities) == calls_before


def test_handshake_alone_accepts_a_certificate_without_extended_key_usage(
    pki: Bundle, plain_server: Server
) -> None:
    # This is the gap the policy exists for; if grpc starts refusing it, update tls.py's docstring.
    assert (
        _call(pki, plain_server.port, "no_usage_extension").status == health_pb2.HealthCheckResponse.SERVING
    )


def test_policy_refuses_a_certificate_without_client_auth_usage(pki: Bundle, policy_server: Server) -> None:
    calls_before = len(policy_server.servicer.identities)
    with pytest.raises(grpc.RpcError) as caught:
        _call(pki, policy_server.port, "no_usage_extension")
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert errors.reason_of(caught.value) == errors.CLIENT_NOT_AUTHENTICATED
    assert len(policy_server.servicer.identities) == calls_before


def test_policy_refuses_identities_not_allowed(pki: Bundle, policy_server: Server) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _call(pki, policy_server.port, "valid_other_name")
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert errors.reason_of(caught.value) == errors.CLIENT_NOT_ALLOWED


def _stream_calls(channel: grpc.Channel) -> list[object]:
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=10)
    first_status = next(iter(watch)).status
    watch.cancel()
    collected = channel.stream_unary("/test.Bytes/Collect")(iter([b"a", b"b"]), timeout=10)
    echoed = list(channel.stream_stream("/test.Bytes/Echo")(iter([b"x", b"y"]), timeout=10))
    return [first_status, collected, echoed]


def test_policy_guards_streaming_methods(pki: Bundle, policy_server: Server) -> None:
    with _channel(pki, policy_server.port, "valid") as channel:
        assert _stream_calls(channel) == [health_pb2.HealthCheckResponse.SERVING, b"ab", [b"x", b"y"]]
    for method in ("watch", "collect", "echo"):
        with _channel(pki, policy_server.port, "no_usage_extension") as channel:
            with pytest.raises(grpc.RpcError) as caught:
                if method == "watch":
                    next(
                        iter(
                            health_pb2_grpc.HealthStub(channel).Watch(
                                health_pb2.HealthCheckRequest(), timeout=10
                            )
                        )
                    )
                elif method == "collect":
                    channel.stream_unary("/test.Bytes/Collect")(iter([b"a"]), timeout=10)
                else:
                    list(channel.stream_stream("/test.Bytes/Echo")(iter([b"a"]), timeout=10))
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, method


def _context(pem: bytes | None) -> SimpleNamespace:
    auth = {"x509_pem_cert": [pem]} if pem else {"transport_security_type": [b"ssl"]}
    return SimpleNamespace(auth_context=lambda: auth)


def test_policy_checks_expiry_itself(pki: Bundle) -> None:
    # The handshake already refuses expired certificates; the policy re-checks on every
    # call, which matters for long-lived connections whose certificate expires mid-way.
    valid = pki.clients["valid"]
    assert valid is not None
    policy = ClientCertificatePolicy()
    assert policy.refusal(_context(valid.cert_pem)) is None
    later = ClientCertificatePolicy(clock=lambda: NOW + dt.timedelta(days=400))
    refusal = later.refusal(_context(valid.cert_pem))
    assert refusal is not None and refusal.reason == errors.CLIENT_NOT_AUTHENTICATED
    assert refusal.code == grpc.StatusCode.UNAUTHENTICATED and "validity" in refusal.message


def test_policy_refuses_a_missing_or_unparsable_certificate() -> None:
    policy = ClientCertificatePolicy()
    for context in (_context(None), _context(b"not a certificate")):
        refusal = policy.refusal(context)
        assert refusal is not None and refusal.reason == errors.CLIENT_NOT_AUTHENTICATED


def test_peer_identity_is_none_without_certificate() -> None:
    assert peer_identity(SimpleNamespace(auth_context=dict)) is None


def test_channel_credentials_need_cert_and_key_together(pki: Bundle) -> None:
    with pytest.raises(ValueError, match="both"):
        channel_credentials(pki.ca.cert_pem, cert_pem=pki.server.cert_pem)
