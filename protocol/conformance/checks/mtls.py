"""Mutual TLS: only a client certificate from the CA the owner trusts for clients, valid now and
meant for client authentication, may reach the service. The certificate checks mint their
certificates with --ca-key, the key of the CA that issued --cert (the trainer organization's in
the two-CA setup), and first prove with a valid control certificate from that CA that the server
accepts its certificates at all: otherwise a refusal would test nothing."""

from __future__ import annotations

import uuid

import grpc

from protocol.conformance.checkpoints import stream, upload_messages, with_nonce
from protocol.conformance.connection import Connection, Identity
from protocol.conformance.context import SuiteContext
from protocol.conformance.pki import CaKeyMismatch, RoguePki, build_rogue_pki
from protocol.conformance.recorder import describe_failure
from protocol.conformance.registry import CheckFailed, CheckSkipped, check, expect
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

REFUSAL_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
TIMEOUT_S = 5.0


def rogue(ctx: SuiteContext) -> RoguePki:
    if ctx.rogue is None:
        ca_key = ctx.options.ca_key.read_bytes() if ctx.options.ca_key else None
        try:
            ctx.rogue = build_rogue_pki(ctx.identity.cert_chain, ca_key, ctx.options.rogue_ca_dir)
        except CaKeyMismatch as error:
            raise CheckFailed(str(error)) from None
    return ctx.rogue


def assert_control_accepted(ctx: SuiteContext) -> None:
    """A valid certificate minted with --ca-key must be accepted, or the refusals test nothing."""
    connection = ctx.connect(_identity(ctx, rogue(ctx).valid_client), unique="control")
    try:
        connection.stub.GetInfo(pb.GetInfoRequest(), timeout=TIMEOUT_S)
    except grpc.RpcError as error:
        failure = describe_failure("GetInfo", error)
        raise CheckFailed(
            f"a valid control certificate minted with --ca-key was refused too ({failure.code.name}"
            f"{' ' + failure.reason if failure.reason else ''}): the server does not trust the CA of --ca-key for "
            "clients, so refusing the bad certificates proves nothing. Pass the key of the CA the server trusts for "
            "client certificates (the trainer organization's ca.key in the two-CA setup)"
        ) from None
    finally:
        connection.close()


def assert_refused(ctx: SuiteContext, connection: Connection, who: str) -> str:
    """Every RPC over `connection` must fail with a refusal code; returns how it was refused."""
    manifest = upload_messages(with_nonce(ctx.checkpoint_files(), uuid.uuid4().hex))[:1]
    calls = {
        "GetInfo": lambda: connection.stub.GetInfo(pb.GetInfoRequest(), timeout=TIMEOUT_S),
        "GetBudget": lambda: connection.stub.GetBudget(pb.GetBudgetRequest(), timeout=TIMEOUT_S),
        "Evaluate": lambda: connection.stub.Evaluate(pb.EvaluateRequest(checkpoint_ids=["0" * 64]), timeout=TIMEOUT_S),
        "UploadCheckpoint": lambda: connection.stub.UploadCheckpoint(stream(manifest), timeout=TIMEOUT_S),
    }
    seen = set()
    try:
        for name, call in calls.items():
            try:
                call()
            except grpc.RpcError as error:
                failure = describe_failure(name, error)
                if failure.code not in REFUSAL_CODES:
                    raise CheckFailed(f"{who}: {name} reached the service ({failure.code.name} {failure.reason}); "
                                      "it should have been refused before any request was processed") from None
                seen.add(f"{failure.code.name}{' ' + failure.reason if failure.reason else ''}")
            else:
                raise CheckFailed(f"{who}: {name} succeeded")
    finally:
        connection.close()
    status = ctx.conn.health_status()
    expect(status == "SERVING", f"the trusted client sees health {status} after the refused connection")
    return f"refused ({', '.join(sorted(seen))})"


def _identity(ctx: SuiteContext, pair) -> Identity:
    return Identity(ctx.identity.root_ca, pair.cert_pem, pair.key_pem)


def _needs_ca_key(ctx: SuiteContext) -> None:
    if ctx.options.ca_key is None:
        raise CheckSkipped("needs --ca-key, the key of the CA that issued --cert (the trainer organization's "
                           "ca.key in the two-CA setup): only a certificate from the CA the server trusts tests this")
    assert_control_accepted(ctx)


@check(
    "mtls.no_client_certificate",
    title="A TLS client without a certificate is refused",
    rationale="""Only trainers holding a certificate from the owner's CA may talk to the node: a client that verifies
    the server but presents no certificate must be refused on every RPC (at the handshake or with
    UNAUTHENTICATED), before any request is processed.""",
    order=20,
)
def no_client_certificate(ctx: SuiteContext) -> str:
    return assert_refused(ctx, ctx.connect(Identity(ctx.identity.root_ca), unique="no-cert"), "no client certificate")


@check(
    "mtls.foreign_ca",
    title="A client certificate from another CA is refused",
    rationale="""A certificate minted by a CA the owner does not trust - here carrying the trusted client's own common
    name - must be refused: identity comes from the owner's CA, never from the name alone.""",
    order=21,
)
def foreign_ca(ctx: SuiteContext) -> str:
    return assert_refused(ctx, ctx.connect(_identity(ctx, rogue(ctx).rogue_client), unique="rogue"), "foreign-CA certificate")


@check(
    "mtls.expired_certificate",
    title="An expired client certificate from the trusted client CA is refused",
    rationale="""Certificate lifetimes bound how long a leaked key is useful; an expired certificate signed by the
    CA the server trusts for clients must be refused. Needs --ca-key (that CA's key) to mint one; a valid control
    certificate from the same CA must be accepted first.""",
    order=22,
)
def expired_certificate(ctx: SuiteContext) -> str:
    _needs_ca_key(ctx)
    return assert_refused(ctx, ctx.connect(_identity(ctx, rogue(ctx).expired_client), unique="expired"), "expired certificate")


@check(
    "mtls.no_client_auth_usage",
    title="A certificate from the trusted client CA without clientAuth usage is refused",
    rationale="""A server certificate (extendedKeyUsage serverAuth only) or a certificate with no extendedKeyUsage at
    all is not a client credential; both must be refused even though the trusted CA signed them. A missing EKU
    passes the TLS handshake (X.509 reads it as 'any usage'), so the server needs an explicit policy. Needs
    --ca-key (the key of the CA that issued --cert) to mint them; a valid control certificate must be accepted
    first.""",
    order=23,
)
def no_client_auth_usage(ctx: SuiteContext) -> str:
    _needs_ca_key(ctx)
    pki = rogue(ctx)
    server_only = assert_refused(ctx, ctx.connect(_identity(ctx, pki.server_usage_client), unique="server-usage"),
                                 "certificate with serverAuth usage only")
    no_usage = assert_refused(ctx, ctx.connect(_identity(ctx, pki.no_usage_client), unique="no-usage"),
                              "certificate without extendedKeyUsage")
    return f"serverAuth-only {server_only}; no-EKU {no_usage}"


@check(
    "mtls.plaintext",
    title="A plaintext (non-TLS) connection is refused",
    rationale="Everything on the wire is confidential; the port must not speak plaintext gRPC.",
    order=24,
)
def plaintext(ctx: SuiteContext) -> str:
    return assert_refused(ctx, ctx.connect_plaintext(unique="plaintext"), "plaintext connection")
