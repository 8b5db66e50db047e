"""PKI generation and file writing (no network)."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest

from protocol.tls import (
    certificate_info,
    generate_ca,
    issue_certificate,
    write_owner_pki,
    write_pem,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ca_and_leaf_certificates_carry_the_right_fields() -> None:
    ca = generate_ca("Owner CA", days=30)
    ca_info = certificate_info(ca.cert_pem)
    assert ca_info.is_ca and ca_info.subject_cn == ca_info.issuer_cn == "Owner CA"
    assert dt.timedelta(days=29) < ca_info.not_after - dt.datetime.now(dt.UTC) <= dt.timedelta(days=30)

    server = certificate_info(
        issue_certificate(ca, "localhost", "server", ["localhost", "127.0.0.1", "::1", "10.1.2.3"]).cert_pem
    )
    assert server.usages == ("serverAuth",) and not server.is_ca
    assert server.issuer_cn == "Owner CA"
    assert set(server.sans) == {"localhost", "127.0.0.1", "::1", "10.1.2.3"}

    client = certificate_info(issue_certificate(ca, "trainer", "client").cert_pem)
    assert client.usages == ("clientAuth",) and client.subject_cn == "trainer" and client.sans == ()

    bare = certificate_info(issue_certificate(ca, "trainer", "client", omit_extended_key_usage=True).cert_pem)
    assert bare.usages == ()


def test_keys_are_ec_p256() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = serialization.load_pem_private_key(generate_ca("ca").key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"


def test_explicit_validity_window_makes_expired_certificates() -> None:
    ca = generate_ca("ca")
    now = dt.datetime.now(dt.UTC)
    pki = issue_certificate(
        ca,
        "trainer",
        "client",
        not_valid_before=now - dt.timedelta(days=3),
        not_valid_after=now - dt.timedelta(days=1),
    )
    assert certificate_info(pki.cert_pem).not_after < now


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"usage": "server", "sans": []}, "subject alternative name"),
        ({"usage": "server", "sans": "localhost"}, "list"),
        ({"usage": "server", "sans": ["bad name"]}, "invalid subject alternative name"),
        ({"usage": "peer"}, "usage"),
        ({"usage": "client", "common_name": ""}, "common_name"),
    ],
)
def test_bad_issue_arguments_are_refused(kwargs: dict, match: str) -> None:
    arguments = {"common_name": "x", **kwargs}
    with pytest.raises((TypeError, ValueError), match=match):
        issue_certificate(generate_ca("ca"), **arguments)


def test_write_owner_pki_modes_and_contents(tmp_path: Path) -> None:
    paths = write_owner_pki(tmp_path / "pki", ["localhost", "127.0.0.1"])
    assert {key: path.name for key, path in paths.items()} == {
        "ca_cert": "ca.pem",
        "ca_key": "ca.key",
        "server_cert": "server.pem",
        "server_key": "server.key",
        "client_cert": "client.pem",
        "client_key": "client.key",
    }
    for key, path in paths.items():
        assert _mode(path) == (0o600 if key.endswith("_key") else 0o644), key
    assert _mode(tmp_path / "pki") == 0o700
    client = certificate_info(paths["client_cert"].read_bytes())
    server = certificate_info(paths["server_cert"].read_bytes())
    ca = certificate_info(paths["ca_cert"].read_bytes())
    assert client.subject_cn == "trainer" and client.issuer_cn == server.issuer_cn == ca.subject_cn
    assert set(server.sans) == {"localhost", "127.0.0.1"}


def test_write_owner_pki_refuses_to_overwrite(tmp_path: Path) -> None:
    first = write_owner_pki(tmp_path, ["localhost"])
    before = first["ca_key"].read_bytes()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_owner_pki(tmp_path, ["localhost"])
    assert first["ca_key"].read_bytes() == before
    second = write_owner_pki(tmp_path, ["localhost"], client_name="alice", overwrite=True)
    assert second["ca_key"].read_bytes() != before
    assert certificate_info(second["client_cert"].read_bytes()).subject_cn == "alice"


def test_write_owner_pki_needs_server_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="server_names"):
        write_owner_pki(tmp_path, [])


def test_write_pem_private_mode_even_when_replacing_a_public_file(tmp_path: Path) -> None:
    path = tmp_path / "x.key"
    path.write_bytes(b"old")
    path.chmod(0o644)
    with pytest.raises(FileExistsError):
        write_pem(path, b"new", private=True)
    assert path.read_bytes() == b"old"
    write_pem(path, b"new", private=True, overwrite=True)
    assert path.read_bytes() == b"new" and _mode(path) == 0o600


def test_write_pem_private_file_is_never_created_world_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    modes = []
    real_open = os.open

    def recording_open(path, flags, mode=0o777, *args, **kwargs):
        modes.append(mode)
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    write_pem(tmp_path / "a.key", b"k", private=True)
    assert modes == [0o600]
