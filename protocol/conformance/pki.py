"""Certificates the server must NOT accept, minted at run time with protocol.tls.

- a rogue CA and a client certificate it signs, carrying the trusted client's own common name
  (an impersonation attempt from outside the owner's PKI);
- with the owner's CA key (--ca-key, available in an owner's self-test): an expired client
  certificate, one whose extendedKeyUsage is serverAuth only, and one with no
  extendedKeyUsage at all (X.509 reads a missing EKU as "any usage", so only an explicit
  server-side policy refuses it).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from protocol.tls import Pki, certificate_info, generate_ca, issue_certificate, write_pem


@dataclass(frozen=True)
class RoguePki:
    rogue_ca: Pki
    rogue_client: Pki                      # signed by the rogue CA
    expired_client: Pki | None = None      # signed by the owner's CA (needs its key)
    server_usage_client: Pki | None = None
    no_usage_client: Pki | None = None


def build_rogue_pki(owner_ca_pem: bytes, trusted_cert_pem: bytes, owner_ca_key_pem: bytes | None,
                    out_dir: Path | None = None) -> RoguePki:
    """Mint the untrusted certificates; with `out_dir`, also write them there as PEM files."""
    name = certificate_info(trusted_cert_pem).subject_cn or "trainer"
    rogue_ca = generate_ca("conformance rogue CA", days=2)
    pki = RoguePki(rogue_ca, issue_certificate(rogue_ca, name, "client", days=2))
    if owner_ca_key_pem is not None:
        owner = Pki(key_pem=owner_ca_key_pem, cert_pem=owner_ca_pem)
        now = dt.datetime.now(dt.UTC)
        pki = RoguePki(
            rogue_ca,
            pki.rogue_client,
            expired_client=issue_certificate(owner, name, "client", not_valid_before=now - dt.timedelta(days=10),
                                             not_valid_after=now - dt.timedelta(days=1)),
            # usage="server" gives an extendedKeyUsage of serverAuth only.
            server_usage_client=issue_certificate(owner, name, "server", sans=["conformance.invalid"], days=2),
            no_usage_client=issue_certificate(owner, name, "client", days=2, omit_extended_key_usage=True),
        )
    if out_dir is not None:
        _write(pki, Path(out_dir))
    return pki


def _write(pki: RoguePki, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for stem, pair in (("rogue-ca", pki.rogue_ca), ("rogue-client", pki.rogue_client),
                       ("expired-client", pki.expired_client), ("server-usage-client", pki.server_usage_client),
                       ("no-usage-client", pki.no_usage_client)):
        if pair is not None:
            write_pem(out_dir / f"{stem}.pem", pair.cert_pem, private=False, overwrite=True)
            write_pem(out_dir / f"{stem}.key", pair.key_pem, private=True, overwrite=True)
