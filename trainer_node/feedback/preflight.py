"""Fail fast, and say why: the trainer's checks of its connection to a target owner at start.

grpc-python reports a wrong CA, a wrong server name and an unreachable owner alike, as
UNAVAILABLE, which the client retries as an outage. So before the first call, `preflight`
does what grpc will do, with the same files, through Python's `ssl` module, and turns each
failure into an OwnerStartError that names the setting to fix:

    feedback.ca_cert / client_cert / client_key   missing, unreadable, not PEM, not a pair,
                                                  the client certificate expired
    feedback.target                               the address does not resolve or accept TCP
    feedback.ca_cert                              the owner's certificate is not signed by it
    feedback.server_name                          the owner's certificate does not name it
    feedback.client_cert                          the owner refused it (TLS alert after the
                                                  handshake, or UNAUTHENTICATED /
                                                  PERMISSION_DENIED on the first call)

`check_owner` runs it and then GetInfo and GetBudget (what `trainer-node check-owner` and the
start of `train` do). `OwnerUnreachable` (a subclass) is the one failure `[feedback]
required = false` tolerates; every other is a misconfiguration and always stops the run.
"""

from __future__ import annotations

import datetime as dt
import re
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from trainer_node.feedback.client import (
    ClientSettings,
    FeedbackError,
    OwnerRefused,
    OwnerUnavailable,
    TargetFeedbackClient,
)

CONNECT_TIMEOUT_S = 5.0
# X509_V_ERR_* codes OpenSSL reports in SSLCertVerificationError.verify_code.
_HOSTNAME_MISMATCH = 62
_CERT_EXPIRED = 10
_CERT_NOT_YET_VALID = 9
# The HTTP/2 client preface plus an empty SETTINGS frame: what a grpc client sends first. A
# grpc server answers with its own SETTINGS, or, having refused our certificate, with an alert.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


class OwnerStartError(FeedbackError):
    """The owner cannot be used as configured; the message names the setting and the fix."""


class OwnerUnreachable(OwnerStartError):
    """Nothing answers at feedback.target (DNS, TCP, or UNAVAILABLE on the first call)."""


@dataclass(frozen=True)
class OwnerStatus:
    """What check-owner prints: the public task card and the budget."""

    info: pb.GetInfoResponse
    budget: pb.GetBudgetResponse


def preflight(settings: ClientSettings, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Check files, TCP and the TLS handshake with the same files grpc will use; OwnerStartError on failure."""
    host, port = split_target(settings.target)
    if settings.insecure:
        _connect(host, port, settings.target, timeout_s).close()
        return
    files = _read_tls_files(settings)
    context = _tls_context(settings, files)
    server_name = settings.server_name or host
    raw = _connect(host, port, settings.target, timeout_s)
    try:
        try:
            tls = context.wrap_socket(raw, server_hostname=server_name)
        except ssl.SSLCertVerificationError as error:
            raise _verification_error(error, settings, server_name) from None
        except ssl.SSLError as error:
            raise _handshake_error(error, settings) from None
        except OSError as error:
            raise OwnerUnreachable(f"feedback.target: {settings.target} closed the connection during the TLS "
                                   f"handshake ({error}); is it the owner's mTLS port?") from None
        with tls:
            _await_verdict_on_client_certificate(tls, settings, timeout_s)
    finally:
        raw.close()


def check_owner(settings: ClientSettings, timeout_s: float = CONNECT_TIMEOUT_S) -> OwnerStatus:
    """preflight, then GetInfo and GetBudget on a real channel; OwnerStartError naming the cause."""
    preflight(settings, timeout_s)
    with TargetFeedbackClient(settings) as client:
        try:
            return OwnerStatus(client.info(), client.budget())
        except OwnerRefused as error:
            raise OwnerStartError(
                f"feedback.client_cert: the owner refused this client ({error}); ask the owner to allow the "
                f"certificate's common name ({_common_name(settings.client_cert)!r}) in access.allowed_clients, "
                "and check that it is a client certificate (clientAuth) valid now"
            ) from None
        except OwnerUnavailable as error:
            raise OwnerUnreachable(f"feedback.target: the owner at {settings.target} is unavailable ({error})") from None


_ENDPOINT_FIELD = re.compile(r"\bfeedback\.(target|ca_cert|client_cert|client_key|server_name)\b")


def located(error: FeedbackError, where: str) -> FeedbackError:
    """The same error naming the owner's own fields: `feedback.ca_cert` -> `feedback.owners[1].ca_cert`
    (`where`), for an owner of [[feedback.owners]]; unchanged for the one [feedback] owner."""
    if where == "feedback" or not isinstance(error, OwnerStartError):
        return error
    return type(error)(_ENDPOINT_FIELD.sub(lambda m: f"{where}.{m.group(1)}", str(error)))


def split_target(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise OwnerStartError(f"feedback.target: must be HOST:PORT, got {target!r}")
    return host.strip("[]"), int(port)


# -- internals -------------------------------------------------------------------------------

def _read_tls_files(settings: ClientSettings) -> dict[str, Path]:
    files = {"ca_cert": settings.ca_cert, "client_cert": settings.client_cert, "client_key": settings.client_key}
    for name, path in files.items():
        if path is None:
            raise OwnerStartError(f"feedback.{name}: required for mutual TLS; set it in the [feedback] section")
        path = Path(path)
        if not path.is_file():
            raise OwnerStartError(f"feedback.{name}: file not found: {path}")
        try:
            path.read_bytes()
        except OSError as error:
            raise OwnerStartError(f"feedback.{name}: cannot read {path} ({error.strerror})") from None
    _refuse_expired_client_certificate(Path(settings.client_cert))
    return {name: Path(path) for name, path in files.items()}


def _refuse_expired_client_certificate(path: Path) -> None:
    from protocol.tls import certificate_info

    try:
        info = certificate_info(path.read_bytes())
    except ValueError:
        raise OwnerStartError(f"feedback.client_cert: {path} is not a PEM certificate") from None
    now = dt.datetime.now(dt.UTC)
    if info.not_after < now:
        raise OwnerStartError(f"feedback.client_cert: {path} expired on {info.not_after:%Y-%m-%d}; have the "
                              "trainer organization's CA rotate it (feedback-protocol certs rotate)")
    if info.not_before > now:
        raise OwnerStartError(f"feedback.client_cert: {path} is not valid before {info.not_before:%Y-%m-%d %H:%M} "
                              "UTC; check this machine's clock")


def _tls_context(settings: ClientSettings, files: dict[str, Path]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)  # verifies the chain and the host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    try:
        context.load_verify_locations(cafile=str(files["ca_cert"]))
    except (ssl.SSLError, ValueError):
        raise OwnerStartError(f"feedback.ca_cert: {files['ca_cert']} is not a PEM CA certificate (it must be the "
                              "OWNER organization's ca.pem)") from None
    try:
        context.load_cert_chain(certfile=str(files["client_cert"]), keyfile=str(files["client_key"]))
    except (ssl.SSLError, ValueError) as error:
        raise OwnerStartError(
            f"feedback.client_cert / feedback.client_key: {files['client_cert']} and {files['client_key']} are not "
            f"a PEM certificate and its private key ({getattr(error, 'reason', None) or error})"
        ) from None
    return context


def _connect(host: str, port: int, target: str, timeout_s: float) -> socket.socket:
    try:
        return socket.create_connection((host, port), timeout=timeout_s)
    except socket.gaierror as error:
        raise OwnerUnreachable(f"feedback.target: cannot resolve {host!r} ({error.strerror})") from None
    except TimeoutError:
        raise OwnerUnreachable(f"feedback.target: no answer from {target} within {timeout_s:g} s (a firewall, or "
                               "a wrong address?)") from None
    except OSError as error:
        raise OwnerUnreachable(f"feedback.target: cannot connect to {target} ({error.strerror or error}); is "
                               "the owner serving there?") from None


def _verification_error(error: ssl.SSLCertVerificationError, settings: ClientSettings,
                        server_name: str) -> OwnerStartError:
    message = error.verify_message or error.reason or str(error)
    if error.verify_code == _HOSTNAME_MISMATCH:
        if settings.server_name:
            return OwnerStartError(
                f"feedback.server_name: the owner's certificate does not name {server_name!r} ({message}); set "
                "server_name to a name the owner's server certificate carries (ask the owner, or see "
                "`feedback-protocol certs show`)"
            )
        return OwnerStartError(
            f"feedback.server_name: the owner's certificate does not name {server_name!r}, the host of "
            f"feedback.target ({message}); set server_name to a name it carries, or dial one"
        )
    if error.verify_code in (_CERT_EXPIRED, _CERT_NOT_YET_VALID):
        return OwnerStartError(f"feedback.target: the owner's server certificate is not valid now ({message}); "
                               "ask the owner to rotate it")
    return OwnerStartError(
        f"feedback.ca_cert: the owner's certificate is not signed by the CA in {settings.ca_cert} ({message}); "
        "ca_cert must be the OWNER organization's ca.pem"
    )


def _handshake_error(error: ssl.SSLError, settings: ClientSettings) -> OwnerStartError:
    reason = (error.reason or str(error)).upper()
    if "ALERT" in reason or "CERTIFICATE" in reason:
        return _client_certificate_refused(settings, error.reason or str(error))
    return OwnerStartError(f"feedback.target: the TLS handshake with {settings.target} failed "
                           f"({error.reason or error}); is it the owner's mTLS port?")


def _await_verdict_on_client_certificate(tls: ssl.SSLSocket, settings: ClientSettings, timeout_s: float) -> None:
    """In TLS 1.3 the server checks the client certificate after the handshake: its refusal comes
    as an alert on the first read. A grpc server that accepts it answers the preface."""
    tls.settimeout(timeout_s)
    try:
        tls.sendall(_H2_PREFACE)
        answer = tls.recv(9)
    except ssl.SSLError as error:
        raise _client_certificate_refused(settings, error.reason or str(error)) from None
    except TimeoutError:
        return  # no verdict within the timeout: the first call will tell
    except OSError as error:
        raise _client_certificate_refused(settings, str(error)) from None
    if not answer:
        raise _client_certificate_refused(settings, "the owner closed the connection")


def _client_certificate_refused(settings: ClientSettings, detail: str) -> OwnerStartError:
    return OwnerStartError(
        f"feedback.client_cert: the owner refused {settings.client_cert} during the TLS handshake ({detail}); it "
        "must be issued by the CA the owner trusts for clients (the owner's tls.ca_cert: the TRAINER "
        "organization's ca.pem) and be a client certificate valid now"
    )


def _common_name(path: Path | None) -> str | None:
    from protocol.tls import certificate_info

    try:
        return certificate_info(Path(path).read_bytes()).subject_cn if path else None
    except (OSError, ValueError):
        return None


def describe_owner(status: OwnerStatus) -> list[str]:
    """What check-owner prints and train logs: the public card and the budget, in a few lines."""
    info, budget = status.info, status.budget
    kind = pb.VerifierKind.Name(info.verifier_kind).removeprefix("VERIFIER_KIND_").lower()
    verifier = info.verifier_name or kind
    rendering = (f"chat format {info.chat_format!r}" if info.chat_format else "a chat template") if info.chat_template \
        else "no chat template"
    lines = [
        f"owner: protocol {info.protocol_version}, {info.heldout_size} held-out rows, verifier {verifier}",
        f"rendering: prompt template {info.prompt_template!r}, {rendering}",
        f"task: {info.task_description or '(no description)'}",
    ]
    if budget.dp_enabled:
        lines.append(
            f"privacy: epsilon budget {budget.epsilon_budget:g} (spent {budget.epsilon_spent:g}, remaining "
            f"{budget.epsilon_remaining:g}), delta {budget.delta:g}, noise std per released accuracy "
            f"{info.privacy.noise_std:.4f}, about {budget.releases_remaining_estimate} releases left"
        )
    else:
        lines.append("privacy: off (exact accuracies, nothing charged)")
    return lines
