"""Certificates the server must NOT accept, minted at run time with protocol.tls.

- a rogue CA and a client certificate it signs, carrying the trusted client's own common name
  (an impersonation attempt from outside the owner's PKI);
- with the key of the CA that issued the trusted client certificate (--ca-key: the owner's
  pki/ca.key after `target-owner-node init`, the TRAINER organization's ca.key in the two-CA
  setup of docs/DEPLOY.md): an expired client certificate, one whose extendedKeyUsage is
  serverAuth only, and one with no extendedKeyUsage at all (X.509 reads a missing EKU as "any
  usage", so only an explicit server-side policy refuses it), plus a valid CONTROL certificate
  that the server must accept. Without the control, a key of the wrong CA (e.g. the owner's own
  in the two-CA setup) would mint certificates refused merely for their issuer, and the checks
  would pass while testing nothing.

The issuing CA is rebuilt from the trusted certificate's issuer name and the key (`client_ca`),
so only the key is needed; `client_ca` refuses a key that did not sign the trusted certificate.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from protocol.tls import Pki, certificate_info, generate_ca, issue_certificate, write_pem


class CaKeyMismatch(ValueError):
    """--ca-key is not the key of the CA that issued the trusted client certificate."""


@dataclass(frozen=True)
class RoguePki:
    rogue_ca: Pki
    rogue_client: Pki                      # signed by the rogue CA
    expired_client: Pki | None = None      # signed by the client certificates' CA (needs its key)
    server_usage_client: Pki | None = None
    no_usage_client: Pki | None = None
    valid_client: Pki | None = None        # the control: same CA, same name, valid, clientAuth: must be accepted


def client_ca(trusted_cert_pem: bytes, ca_key_pem: bytes) -> Pki:
    """The CA that issued `trusted_cert_pem`, rebuilt from its issuer name and `ca_key_pem`.

    Raises CaKeyMismatch when the key did not sign the trusted certificate."""
    trusted = x509.load_pem_x509_certificate(trusted_cert_pem)
    try:
        key = serialization.load_pem_private_key(ca_key_pem, password=None)
    except (ValueError, TypeError) as error:
        raise CaKeyMismatch(f"--ca-key is not an unencrypted PEM private key ({error})") from None
    if not _signed_by(trusted, key.public_key()):
        raise CaKeyMismatch(
            f"--ca-key did not sign --cert (issued by {certificate_info(trusted_cert_pem).issuer_cn!r}): it must be "
            "the key of the CA that issues the trusted client certificates (after `target-owner-node init`, "
            "pki/ca.key; in the two-CA setup of docs/DEPLOY.md, the TRAINER organization's ca.key)"
        )
    now = dt.datetime.now(dt.UTC)
    rebuilt = (
        x509.CertificateBuilder()
        .subject_name(trusted.issuer)
        .issuer_name(trusted.issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Pki(key_pem=ca_key_pem, cert_pem=rebuilt.public_bytes(serialization.Encoding.PEM))


def _signed_by(cert: x509.Certificate, public_key) -> bool:
    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
        elif isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(),
                              cert.signature_hash_algorithm)
        else:
            public_key.verify(cert.signature, cert.tbs_certificate_bytes)
    except (InvalidSignature, TypeError, ValueError):
        return False
    return True


def build_rogue_pki(trusted_cert_pem: bytes, ca_key_pem: bytes | None, out_dir: Path | None = None) -> RoguePki:
    """Mint the untrusted certificates (and, with the client CA's key, the control); with
    `out_dir`, also write them there as PEM files. CaKeyMismatch for a key of the wrong CA."""
    name = certificate_info(trusted_cert_pem).subject_cn or "trainer"
    rogue_ca = generate_ca("conformance rogue CA", days=2)
    pki = RoguePki(rogue_ca, issue_certificate(rogue_ca, name, "client", days=2))
    if ca_key_pem is not None:
        issuer = client_ca(trusted_cert_pem, ca_key_pem)
        now = dt.datetime.now(dt.UTC)
        pki = RoguePki(
            rogue_ca,
            pki.rogue_client,
            expired_client=issue_certificate(issuer, name, "client", not_valid_before=now - dt.timedelta(days=10),
                                             not_valid_after=now - dt.timedelta(days=1)),
            # usage="server" gives an extendedKeyUsage of serverAuth only.
            server_usage_client=issue_certificate(issuer, name, "server", sans=["conformance.invalid"], days=2),
            no_usage_client=issue_certificate(issuer, name, "client", days=2, omit_extended_key_usage=True),
            valid_client=issue_certificate(issuer, name, "client", days=2),
        )
    if out_dir is not None:
        _write(pki, Path(out_dir))
    return pki


def _write(pki: RoguePki, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for stem, pair in (("rogue-ca", pki.rogue_ca), ("rogue-client", pki.rogue_client),
                       ("expired-client", pki.expired_client), ("server-usage-client", pki.server_usage_client),
                       ("no-usage-client", pki.no_usage_client), ("control-client", pki.valid_client)):
        if pair is not None:
            write_pem(out_dir / f"{stem}.pem", pair.cert_pem, private=False, overwrite=True)
            write_pem(out_dir / f"{stem}.key", pair.key_pem, private=True, overwrite=True)
