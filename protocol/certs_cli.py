"""`feedback-protocol certs`: a small PKI for two organizations.

Each organization runs its OWN certificate authority and keeps its CA key to itself. Only
CA certificates (ca.pem) cross between the organizations:

    owner org:   init-ca -> issue --usage server   (the node's TLS certificate)
    trainer org: init-ca -> issue --usage client   (the trainer's identity)
    exchange:    owner gets the trainer's ca.pem (verifies client certificates);
                 trainer gets the owner's ca.pem (verifies the server)

So each side's TLS configuration names the OTHER organization's CA. Private keys are
written 0600 and never leave the machine they were made on.

    feedback-protocol certs init-ca --org NAME --out DIR
    feedback-protocol certs issue --ca DIR --usage server|client --name CN [--san NAME ...] --out DIR
    feedback-protocol certs show FILE...
    feedback-protocol certs rotate --ca DIR --cert FILE --out DIR
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from pathlib import Path

CA_CERT, CA_KEY = "ca.pem", "ca.key"
WARN_DAYS = 30


class CertsError(RuntimeError):
    """A certs command that cannot proceed; the message says what to do instead."""


# -- operations (plain functions, also used by tests) --------------------------------------
def init_ca(org: str, out: Path, days: int = 3650) -> tuple[Path, Path]:
    """Create DIR/ca.pem (share it) and DIR/ca.key (0600, never share). Refuses to overwrite."""
    from protocol.tls import generate_ca, write_pem

    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    _refuse_existing([out / CA_CERT, out / CA_KEY])
    ca = generate_ca(f"{org} CA", days=days)
    key = write_pem(out / CA_KEY, ca.key_pem, private=True)
    cert = write_pem(out / CA_CERT, ca.cert_pem, private=False)
    return cert, key


def issue(
    ca_dir: Path,
    usage: str,
    name: str,
    sans: Sequence[str],
    out: Path,
    days: int = 365,
    stem: str | None = None,
) -> tuple[Path, Path]:
    """Issue OUT/<stem>.pem + OUT/<stem>.key (stem defaults to the usage: server or client).

    A server certificate's SANs are [name, *sans]; they must contain every host name or IP
    address the trainer dials. A client certificate's CN is the identity the owner sees
    (what `[access] allowed_clients` lists)."""
    from protocol.tls import issue_certificate, write_pem

    ca = _load_ca(ca_dir)
    stem = stem or usage
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_path, key_path = out / f"{stem}.pem", out / f"{stem}.key"
    _refuse_existing([cert_path, key_path])
    if usage == "server":
        sans = [name, *(s for s in sans if s != name)]  # the CN is dialable too (clients ignore CN)
    leaf = issue_certificate(ca, name, usage, list(sans), days=days)  # type: ignore[arg-type]
    write_pem(key_path, leaf.key_pem, private=True)
    write_pem(cert_path, leaf.cert_pem, private=False)
    return cert_path, key_path


def rotate(ca_dir: Path, cert_file: Path, out: Path, days: int | None = None) -> tuple[Path, Path]:
    """Reissue `cert_file` with the same subject, SANs and usage and a FRESH key.

    Writes OUT/<name>.pem and OUT/<stem>.key. Files already there (e.g. the old pair when
    OUT is the certificate's own folder) are renamed to *.bak first. `days` defaults to
    the old certificate's lifetime. Refuses a certificate that `ca_dir` did not issue."""
    from cryptography import x509

    from protocol.tls import certificate_info, issue_certificate, write_pem

    ca = _load_ca(ca_dir)
    old_pem = _read(cert_file)
    info = certificate_info(old_pem)
    ca_subject = x509.load_pem_x509_certificate(ca.cert_pem).subject
    if x509.load_pem_x509_certificate(old_pem).issuer != ca_subject:
        raise CertsError(
            f"{cert_file} was issued by {info.issuer_cn!r}, not by the CA in {ca_dir}; "
            "rotate it with the CA that issued it"
        )
    if info.is_ca:
        raise CertsError(f"{cert_file} is a CA certificate; create a new CA with `certs init-ca` instead")
    usages = [u for u in ("server", "client") if f"{u}Auth" in info.usages]
    if len(usages) != 1:
        raise CertsError(f"{cert_file} has usages {info.usages}; expected exactly serverAuth or clientAuth")
    if days is None:
        days = max(1, round((info.not_after - info.not_before).total_seconds() / 86400))
    leaf = issue_certificate(ca, info.subject_cn or "", usages[0], list(info.sans), days=days)  # type: ignore[arg-type]
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_path = out / cert_file.name
    key_path = out / f"{cert_file.stem}.key"
    for path in (cert_path, key_path):
        if path.exists():
            path.replace(path.with_name(path.name + ".bak"))  # keeps the old mode (0600 keys)
    write_pem(key_path, leaf.key_pem, private=True)
    write_pem(cert_path, leaf.cert_pem, private=False)
    return cert_path, key_path


def describe(cert_file: Path, now: dt.datetime | None = None, warn_days: int = WARN_DAYS) -> tuple[str, int]:
    """A human summary of one certificate and its days left (negative when expired)."""
    from protocol.tls import certificate_info

    info = certificate_info(_read(cert_file))
    now = now or dt.datetime.now(dt.UTC)
    days_left = int((info.not_after - now).total_seconds() // 86400)
    kind = "CA certificate" if info.is_ca else "leaf certificate"
    lines = [
        f"{cert_file}: {kind}",
        f"  subject:   CN={info.subject_cn}",
        f"  issuer:    CN={info.issuer_cn}",
        f"  valid:     {info.not_before:%Y-%m-%d %H:%M} .. {info.not_after:%Y-%m-%d %H:%M} UTC",
        f"  days left: {days_left}",
        f"  usages:    {', '.join(info.usages) or ('(CA: signs certificates)' if info.is_ca else '(none)')}",
    ]
    if info.sans:
        lines.append(f"  SANs:      {', '.join(info.sans)}")
    if now > info.not_after:
        lines.append("  EXPIRED: TLS handshakes with this certificate fail; rotate it now")
    elif days_left < warn_days:
        lines.append(f"  WARNING: expires in {days_left} days (< {warn_days}); rotate it soon")
    return "\n".join(lines), days_left


# -- helpers -----------------------------------------------------------------------------------
def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CertsError(f"{path} does not exist") from None


def _load_ca(ca_dir: Path):
    from protocol.tls import Pki, certificate_info

    cert, key = ca_dir / CA_CERT, ca_dir / CA_KEY
    if not key.exists():
        raise CertsError(
            f"{key} not found: --ca must be the folder `certs init-ca` wrote (with ca.pem and ca.key), "
            "on the machine of the organization that owns that CA"
        )
    pem = _read(cert)
    if not certificate_info(pem).is_ca:
        raise CertsError(f"{cert} is not a CA certificate")
    return Pki(key_pem=key.read_bytes(), cert_pem=pem)


def _refuse_existing(paths: Sequence[Path]) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise CertsError(f"{', '.join(existing)} already exist(s); use another --out or `certs rotate`")


# -- command line ------------------------------------------------------------------------------
DESCRIPTION = __doc__


def add_certs_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `certs` (init-ca, issue, show, rotate) on a `feedback-protocol` subparsers object."""
    certs = subparsers.add_parser(
        "certs",
        help="create CAs and certificates for the two organizations, show and rotate them",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = certs.add_subparsers(dest="certs_command", required=True, metavar="ACTION")

    p = actions.add_parser("init-ca", help="create this organization's CA (ca.pem to share, ca.key to keep)")
    p.add_argument("--org", required=True, help="organization name; the CA's CN is 'NAME CA'")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for ca.pem and ca.key")
    p.add_argument("--days", type=int, default=3650, help="CA lifetime in days (default 3650)")
    p.set_defaults(func=_run_init_ca)

    p = actions.add_parser("issue", help="issue a server (owner) or client (trainer) certificate")
    p.add_argument("--ca", type=Path, required=True, metavar="DIR", help="folder written by init-ca")
    p.add_argument("--usage", choices=("server", "client"), required=True)
    p.add_argument("--name", required=True, metavar="CN",
                   help="common name: the server's host name, or the client identity the owner allowlists")
    p.add_argument("--san", action="append", default=[], metavar="NAME",
                   help="extra DNS name or IP address the trainer dials (server; repeatable; --name is always included)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for <usage>.pem/.key")
    p.add_argument("--stem", help="file name stem (default: the usage)")
    p.add_argument("--days", type=int, default=365, help="lifetime in days (default 365)")
    p.set_defaults(func=_run_issue)

    p = actions.add_parser("show", help="subject, issuer, validity, days left, usages; warns < 30 days")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--warn-days", type=int, default=WARN_DAYS, help=f"warn below this many days (default {WARN_DAYS})")
    p.set_defaults(func=_run_show)

    p = actions.add_parser("rotate", help="reissue a certificate with a fresh key (old files kept as .bak)")
    p.add_argument("--ca", type=Path, required=True, metavar="DIR", help="folder written by init-ca")
    p.add_argument("--cert", type=Path, required=True, metavar="FILE", help="the certificate to replace")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the new pair goes")
    p.add_argument("--days", type=int, help="lifetime in days (default: the old certificate's)")
    p.set_defaults(func=_run_rotate)


def _guarded(body) -> int:
    try:
        body()
    except (CertsError, ValueError, FileExistsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def _run_init_ca(args: argparse.Namespace) -> int:
    def body() -> None:
        cert, key = init_ca(args.org, args.out, args.days)
        print(f"wrote {cert} (share with the other organization)")
        print(f"wrote {key} (0600; keep it here, never share it)")

    return _guarded(body)


def _run_issue(args: argparse.Namespace) -> int:
    def body() -> None:
        cert, key = issue(args.ca, args.usage, args.name, args.san, args.out, args.days, args.stem)
        print(f"wrote {cert}")
        print(f"wrote {key} (0600; stays on the machine that uses it)")

    return _guarded(body)


def _run_show(args: argparse.Namespace) -> int:
    status = 0
    for path in args.files:
        try:
            text, days_left = describe(path, warn_days=args.warn_days)
        except (CertsError, ValueError) as error:
            print(f"error: {path}: {error}", file=sys.stderr)
            status = 2
            continue
        print(text)
        if days_left < 0 and status == 0:
            status = 1
    return status


def _run_rotate(args: argparse.Namespace) -> int:
    def body() -> None:
        cert, key = rotate(args.ca, args.cert, args.out, args.days)
        print(f"wrote {cert} and {key} (fresh key; previous files kept as *.bak)")
        print("restart the process that uses them; the other organization needs nothing new")

    return _guarded(body)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (`python -m protocol.certs_cli ...`) until protocol/cli.py registers certs."""
    parser = argparse.ArgumentParser(prog="feedback-protocol")
    add_certs_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main(["certs", *sys.argv[1:]] if sys.argv[1:2] != ["certs"] else sys.argv[1:]))
