"""`feedback-protocol certs`: init-ca, issue, show, rotate (through the argparse entry)."""

from __future__ import annotations

import argparse
import datetime as dt

import pytest

from protocol.certs_cli import add_certs_parser, main
from protocol.tls import certificate_info, generate_ca, issue_certificate, write_pem


def mode(path) -> int:
    return path.stat().st_mode & 0o777


def test_registers_on_a_feedback_protocol_parser():
    parser = argparse.ArgumentParser(prog="feedback-protocol")
    add_certs_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["certs", "show", "x.pem"])
    assert callable(args.func)


def test_init_ca_and_issue_server_and_client(tmp_path, capsys):
    assert main(["certs", "init-ca", "--org", "owner-org", "--out", str(tmp_path / "ca")]) == 0
    assert mode(tmp_path / "ca" / "ca.key") == 0o600 and mode(tmp_path / "ca" / "ca.pem") == 0o644
    assert "share" in capsys.readouterr().out
    ca = certificate_info((tmp_path / "ca" / "ca.pem").read_bytes())
    assert ca.is_ca and ca.subject_cn == "owner-org CA"

    args = ["certs", "issue", "--ca", str(tmp_path / "ca"), "--usage", "server", "--name", "owner.example"]
    assert main([*args, "--san", "10.213.7.1", "--out", str(tmp_path / "srv")]) == 0
    server = certificate_info((tmp_path / "srv" / "server.pem").read_bytes())
    assert server.usages == ("serverAuth",) and server.issuer_cn == "owner-org CA"
    assert set(server.sans) == {"owner.example", "10.213.7.1"}, "the CN is always a SAN too"
    assert mode(tmp_path / "srv" / "server.key") == 0o600

    args = ["certs", "issue", "--ca", str(tmp_path / "ca"), "--usage", "client", "--name", "trainer"]
    assert main([*args, "--out", str(tmp_path / "cli")]) == 0
    client = certificate_info((tmp_path / "cli" / "client.pem").read_bytes())
    assert client.usages == ("clientAuth",) and client.subject_cn == "trainer" and not client.is_ca
    assert mode(tmp_path / "cli" / "client.key") == 0o600


def test_refusals_are_clear_and_change_nothing(tmp_path, capsys):
    assert main(["certs", "init-ca", "--org", "a", "--out", str(tmp_path / "ca")]) == 0
    before = (tmp_path / "ca" / "ca.key").read_bytes()
    assert main(["certs", "init-ca", "--org", "a", "--out", str(tmp_path / "ca")]) == 2
    assert "already exist" in capsys.readouterr().err
    assert (tmp_path / "ca" / "ca.key").read_bytes() == before
    # --ca must hold the CA key: a folder with only someone else's ca.pem cannot issue
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "ca.pem").write_bytes((tmp_path / "ca" / "ca.pem").read_bytes())
    args = ["certs", "issue", "--ca", str(tmp_path / "other"), "--usage", "client", "--name", "t"]
    assert main([*args, "--out", str(tmp_path / "x")]) == 2
    assert "ca.key not found" in capsys.readouterr().err
    assert not (tmp_path / "x" / "client.key").exists()


def test_show_reports_days_left_and_warns_before_expiry(tmp_path, capsys):
    ca = generate_ca("org CA")
    write_pem(tmp_path / "soon.pem", issue_certificate(ca, "t", "client", days=10).cert_pem, private=False)
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=40)
    expired = issue_certificate(ca, "old", "client", not_valid_before=past, not_valid_after=past + dt.timedelta(days=5))
    write_pem(tmp_path / "old.pem", expired.cert_pem, private=False)
    write_pem(tmp_path / "ca.pem", ca.cert_pem, private=False)

    assert main(["certs", "show", str(tmp_path / "soon.pem"), str(tmp_path / "ca.pem")]) == 0
    out = capsys.readouterr().out
    assert "subject:   CN=t" in out and "issuer:    CN=org CA" in out and "clientAuth" in out
    assert "days left: 10" in out or "days left: 9" in out
    assert "WARNING: expires in" in out and out.count("WARNING") == 1  # the CA has 365 days
    assert main(["certs", "show", str(tmp_path / "old.pem")]) == 1
    assert "EXPIRED" in capsys.readouterr().out
    assert main(["certs", "show", str(tmp_path / "missing.pem")]) == 2


def test_rotate_keeps_subject_sans_usage_and_backs_up_the_old_pair(tmp_path, capsys):
    main(["certs", "init-ca", "--org", "owner-org", "--out", str(tmp_path / "ca")])
    issue = ["certs", "issue", "--ca", str(tmp_path / "ca"), "--usage", "server", "--name", "owner"]
    main([*issue, "--san", "127.0.0.1", "--days", "30", "--out", str(tmp_path / "tls")])
    old_cert, old_key = (tmp_path / "tls" / "server.pem").read_bytes(), (tmp_path / "tls" / "server.key").read_bytes()

    args = ["certs", "rotate", "--ca", str(tmp_path / "ca"), "--cert", str(tmp_path / "tls" / "server.pem")]
    assert main([*args, "--out", str(tmp_path / "tls")]) == 0
    new = certificate_info((tmp_path / "tls" / "server.pem").read_bytes())
    old = certificate_info(old_cert)
    assert (new.subject_cn, set(new.sans), new.usages, new.issuer_cn) == (
        old.subject_cn, set(old.sans), old.usages, old.issuer_cn,
    )
    assert new.not_after >= old.not_after and (tmp_path / "tls" / "server.pem").read_bytes() != old_cert
    assert (tmp_path / "tls" / "server.key").read_bytes() != old_key, "a fresh key"
    assert (tmp_path / "tls" / "server.pem.bak").read_bytes() == old_cert
    assert (tmp_path / "tls" / "server.key.bak").read_bytes() == old_key
    assert mode(tmp_path / "tls" / "server.key") == 0o600 and mode(tmp_path / "tls" / "server.key.bak") == 0o600
    assert round((new.not_after - new.not_before).days) in (30, 31)  # same lifetime as before
    capsys.readouterr()

    # a certificate from another organization's CA cannot be rotated with this one
    main(["certs", "init-ca", "--org", "trainer-org", "--out", str(tmp_path / "tca")])
    main(["certs", "issue", "--ca", str(tmp_path / "tca"), "--usage", "client", "--name", "t", "--out", str(tmp_path / "c")])
    args = ["certs", "rotate", "--ca", str(tmp_path / "ca"), "--cert", str(tmp_path / "c" / "client.pem")]
    assert main([*args, "--out", str(tmp_path / "c")]) == 2
    assert "not by the CA" in capsys.readouterr().err
    assert not (tmp_path / "c" / "client.pem.bak").exists()


def test_module_entry_without_the_certs_word(tmp_path):
    """`python -m protocol.certs_cli init-ca ...` works until protocol/cli.py registers certs."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "protocol.certs_cli", "init-ca", "--org", "o", "--out", str(tmp_path / "ca")],
        check=False, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ca" / "ca.key").exists()


@pytest.mark.parametrize("usage", ["server", "client"])
def test_issue_with_days(tmp_path, usage):
    main(["certs", "init-ca", "--org", "o", "--out", str(tmp_path / "ca")])
    args = ["certs", "issue", "--ca", str(tmp_path / "ca"), "--usage", usage, "--name", "n", "--days", "7"]
    assert main([*args, "--out", str(tmp_path / "o")]) == 0
    info = certificate_info((tmp_path / "o" / f"{usage}.pem").read_bytes())
    assert 6 <= (info.not_after - dt.datetime.now(dt.UTC)).days <= 7
