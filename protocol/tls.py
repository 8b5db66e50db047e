"""Mutual TLS for the target-feedback channel: a small PKI built with `cryptography`
(no openssl subprocess), gRPC credential helpers, and a server-side client-certificate
policy.

Who checks what (measured by tests/protocol/test_tls_grpc.py against grpcio's BoringSSL):
- The TLS handshake (require_client_auth=True) refuses a client with no certificate, a
  certificate from another CA, and an expired certificate. It also refuses a certificate
  whose extendedKeyUsage lists only serverAuth.
- The handshake ACCEPTS a client certificate without any extendedKeyUsage extension (X.509
  treats a missing EKU as "any usage"). `ClientCertificatePolicy` closes that gap: it
  requires an explicit clientAuth EKU and re-checks the validity window on every call,
  aborting with UNAUTHENTICATED / CLIENT_NOT_AUTHENTICATED.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from protocol import errors

# Issued certificates start a little in the past so that small clock skew between the
# two parties does not make a fresh certificate "not yet valid".
CLOCK_SKEW = dt.timedelta(minutes=5)

_USAGE_OIDS = {"server": ExtendedKeyUsageOID.SERVER_AUTH, "client": ExtendedKeyUsageOID.CLIENT_AUTH}
_USAGE_NAMES = {ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth", ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth"}


@dataclass(frozen=True)
class Pki:
    """One key pair and its certificate, both PEM-encoded."""

    key_pem: bytes
    cert_pem: bytes


@dataclass(frozen=True)
class CertInfo:
    """What an operator needs to see about a certificate (e.g. when it expires)."""

    subject_cn: str | None
    issuer_cn: str | None
    not_before: dt.datetime
    not_after: dt.datetime
    is_ca: bool
    usages: tuple[str, ...]  # extended key usages, e.g. ("serverAuth",); () when absent
    sans: tuple[str, ...]  # DNS names and IP addresses


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    if not common_name or not isinstance(common_name, str):
        raise ValueError("common_name must be a non-empty string")
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(name: str) -> x509.GeneralName:
    """An IP address entry when `name` parses as one ("127.0.0.1", "::1"), else DNS."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        if not name or any(c.isspace() for c in name) or "/" in name:
            raise ValueError(f"invalid subject alternative name {name!r}") from None
        return x509.DNSName(name)


def generate_ca(common_name: str, days: int = 365) -> Pki:
    """A self-signed certificate authority (EC P-256) valid for `days`."""
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days!r}")
    key = _new_key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Pki(key_pem=_key_pem(key), cert_pem=cert.public_bytes(serialization.Encoding.PEM))


def issue_certificate(
    ca: Pki,
    common_name: str,
    usage: Literal["server", "client"],
    sans: Sequence[str] = (),
    days: int = 365,
    not_valid_before: dt.datetime | None = None,
    not_valid_after: dt.datetime | None = None,
    omit_extended_key_usage: bool = False,
) -> Pki:
    """A leaf certificate signed by `ca`.

    usage="server": extendedKeyUsage serverAuth; `sans` (DNS names and/or IP addresses,
        e.g. "localhost", "127.0.0.1", "::1") are what clients verify, so at least one is
        required. usage="client": extendedKeyUsage clientAuth; the CN is the client's
        identity as the server sees it (`peer_identity`).
    not_valid_before / not_valid_after / omit_extended_key_usage exist so that tests can
    build bad certificates (expired, no usage restriction).
    """
    if usage not in _USAGE_OIDS:
        raise ValueError(f"usage must be 'server' or 'client', got {usage!r}")
    if isinstance(sans, str):
        raise TypeError("sans must be a list of names, not a string")
    if usage == "server" and not sans:
        raise ValueError("a server certificate needs at least one subject alternative name")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = _new_key()
    start = not_valid_before or (_now() - CLOCK_SKEW)
    end = not_valid_after or (start + CLOCK_SKEW + dt.timedelta(days=days))
    if end <= start:
        raise ValueError("not_valid_after must be later than not_valid_before")
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if not omit_extended_key_usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage([_USAGE_OIDS[usage]]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in sans]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return Pki(key_pem=_key_pem(key), cert_pem=cert.public_bytes(serialization.Encoding.PEM))


def write_pem(path: str | os.PathLike[str], data: bytes, private: bool, overwrite: bool = False) -> Path:
    """Write PEM bytes; private files are 0600 from the moment they exist.

    The mode is given to os.open, so a key is never briefly readable by others. An
    existing file is refused unless overwrite=True (then it is replaced, not truncated,
    so an old 0644 file cannot keep its mode).
    """
    path = Path(path)
    mode = 0o600 if private else 0o644
    if overwrite:
        path.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it") from None
    try:
        os.fchmod(fd, mode)  # the umask may have removed bits from a public file
        with os.fdopen(fd, "wb") as handle:
            fd = -1
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        if fd != -1:
            os.close(fd)
    return path


def write_owner_pki(
    directory: str | os.PathLike[str],
    server_names: Sequence[str],
    client_name: str = "trainer",
    days: int = 365,
    overwrite: bool = False,
) -> dict[str, Path]:
    """The owner's `init` PKI: one CA issuing both the server and the trainer's client
    certificate. Writes ca.pem, ca.key, server.pem, server.key, client.pem, client.key
    and returns their paths under the keys ca_cert, ca_key, server_cert, server_key,
    client_cert, client_key. A single-CA setup for a rehearsal on one machine (the owner made the
trainer's key); across two organizations each makes its own CA (docs/DEPLOY.md)."""
    if isinstance(server_names, str) or not server_names:
        raise ValueError("server_names must be a non-empty list, e.g. ['localhost', '127.0.0.1']")
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = generate_ca("target-feedback owner CA", days=days)
    server = issue_certificate(ca, server_names[0], "server", server_names, days)
    client = issue_certificate(ca, client_name, "client", days=days)
    files = {
        "ca_cert": ("ca.pem", ca.cert_pem, False),
        "ca_key": ("ca.key", ca.key_pem, True),
        "server_cert": ("server.pem", server.cert_pem, False),
        "server_key": ("server.key", server.key_pem, True),
        "client_cert": ("client.pem", client.cert_pem, False),
        "client_key": ("client.key", client.key_pem, True),
    }
    if not overwrite:  # refuse before writing anything, so a failure leaves no mix
        existing = [name for name, _, _ in files.values() if (directory / name).exists()]
        if existing:
            raise FileExistsError(
                f"{directory} already holds {existing}; pass overwrite=True to replace them"
            )
    return {
        key: write_pem(directory / name, data, private=private, overwrite=overwrite)
        for key, (name, data, private) in files.items()
    }


def server_credentials(
    ca_pem: bytes, cert_pem: bytes, key_pem: bytes, require_client_auth: bool = True
) -> grpc.ServerCredentials:
    """Server TLS credentials; with require_client_auth the client must present a
    certificate chaining to `ca_pem` (see the module docstring for what that checks)."""
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=require_client_auth
    )


def channel_credentials(
    ca_pem: bytes, cert_pem: bytes | None = None, key_pem: bytes | None = None
) -> grpc.ChannelCredentials:
    """Client TLS credentials trusting `ca_pem`; pass cert and key for mutual TLS."""
    if (cert_pem is None) != (key_pem is None):
        raise ValueError("give both cert_pem and key_pem, or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
    )


def _auth_value(context: grpc.ServicerContext, key: str) -> bytes | None:
    values = (context.auth_context() or {}).get(key) or []
    return values[0] if values else None


def peer_identity(context: grpc.ServicerContext) -> str | None:
    """The verified client certificate's common name, or None without one."""
    value = _auth_value(context, "x509_common_name")
    return value.decode("utf-8", "replace") if value else None


def _common_name(name: x509.Name) -> str | None:
    attributes = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attributes[0].value) if attributes else None


def _extension(cert: x509.Certificate, kind: type[Any]) -> Any | None:
    try:
        return cert.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None


def certificate_info(pem: bytes) -> CertInfo:
    """Subject, issuer, validity, CA flag, extended key usages and SANs of a PEM cert."""
    cert = x509.load_pem_x509_certificate(pem)
    constraints = _extension(cert, x509.BasicConstraints)
    eku = _extension(cert, x509.ExtendedKeyUsage)
    san = _extension(cert, x509.SubjectAlternativeName)
    sans: list[str] = []
    if san is not None:
        sans += san.get_values_for_type(x509.DNSName)
        sans += [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return CertInfo(
        subject_cn=_common_name(cert.subject),
        issuer_cn=_common_name(cert.issuer),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        is_ca=bool(constraints and constraints.ca),
        usages=tuple(_USAGE_NAMES.get(oid, oid.dotted_string) for oid in (eku or [])),
        sans=tuple(sans),
    )


class ClientCertificatePolicy(grpc.ServerInterceptor):
    """Checks every call's client certificate beyond what the TLS handshake checks.

    Refuses (UNAUTHENTICATED, reason CLIENT_NOT_AUTHENTICATED) a call with no client
    certificate, one outside its validity window, or one without an explicit
    clientAuth extendedKeyUsage. With `allowed_identities`, a valid certificate whose CN
    is not listed is refused with PERMISSION_DENIED / CLIENT_NOT_ALLOWED.
    """

    def __init__(
        self,
        allowed_identities: Iterable[str] | None = None,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self._allowed = frozenset(allowed_identities) if allowed_identities is not None else None
        self._clock = clock

    def refusal(self, context: grpc.ServicerContext) -> errors.ProtocolError | None:
        """Why this call's peer is refused, or None when it passes."""

        def unauthenticated(message: str) -> errors.ProtocolError:
            return errors.ProtocolError(
                grpc.StatusCode.UNAUTHENTICATED, errors.CLIENT_NOT_AUTHENTICATED, message
            )

        pem = _auth_value(context, "x509_pem_cert")
        if not pem:
            return unauthenticated("a client certificate is required")
        try:
            info = certificate_info(pem)
        except ValueError:
            return unauthenticated("the client certificate could not be parsed")
        now = self._clock()
        if not (info.not_before <= now <= info.not_after):
            return unauthenticated("the client certificate is outside its validity period")
        if "clientAuth" not in info.usages:
            return unauthenticated("the client certificate lacks the clientAuth extended key usage")
        if self._allowed is not None and info.subject_cn not in self._allowed:
            return errors.ProtocolError(
                grpc.StatusCode.PERMISSION_DENIED, errors.CLIENT_NOT_ALLOWED, "this client is not allowed"
            )
        return None

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        if handler is None:
            return None
        for kind, factory in _HANDLER_FACTORIES.items():
            behavior = getattr(handler, kind)
            if behavior is not None:
                return factory(
                    self._guard(behavior),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

    def _guard(
        self, behavior: Callable[[Any, grpc.ServicerContext], Any]
    ) -> Callable[[Any, grpc.ServicerContext], Any]:
        def guarded(request_or_iterator: Any, context: grpc.ServicerContext) -> Any:
            refusal = self.refusal(context)
            if refusal is not None:
                context.abort_with_status(refusal.to_status())  # raises
            return behavior(request_or_iterator, context)

        return guarded


_HANDLER_FACTORIES = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}
