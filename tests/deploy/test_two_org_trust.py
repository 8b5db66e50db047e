"""Each organization's TLS settings name the OTHER organization's CA.

owner:   [tls] ca_cert = the trainer org's CA (verifies client certificates)
trainer: ClientSettings.ca_cert = the owner org's CA (verifies the server)

Checked over real mTLS against an in-process owner node: the right setup works; a client
certificate minted by the owner's own CA, or a trainer that trusts its own CA for the
server, fails; a CA bundle lets the owner accept an old and a new trainer CA during a CA
rotation; a rotated client certificate needs nothing from the owner.
"""

from __future__ import annotations

import pytest

from protocol.certs_cli import init_ca, issue, rotate
from trainer_node.feedback.client import FeedbackError, TargetFeedbackClient

from .conftest import client_settings, in_process_owner, owner_config


def _info(settings):
    with TargetFeedbackClient(settings) as client:
        return client.info()


@pytest.fixture()
def owner(tmp_path, data_dir, two_orgs):
    with in_process_owner(owner_config(tmp_path / "storage", data_dir, two_orgs), tmp_path) as running:
        yield running


def test_cross_trust_works_and_conflated_trust_fails(owner, two_orgs, tmp_path):
    target = f"localhost:{owner.port}"
    assert _info(client_settings(two_orgs, target)).heldout_size > 0

    # A "trainer" certificate issued by the OWNER's CA: the owner trusts only the trainer org's CA.
    cert, key = issue(two_orgs.owner_ca, "client", "trainer", [], tmp_path / "minted")
    with pytest.raises(FeedbackError):
        _info(client_settings(two_orgs, target, client_cert=cert, client_key=key))

    # A trainer that trusts its OWN CA for the server cannot verify the owner's certificate.
    with pytest.raises(FeedbackError):
        _info(client_settings(two_orgs, target, ca_cert=two_orgs.trainer_ca_cert))


def test_rotated_client_certificate_needs_no_owner_change(owner, two_orgs, tmp_path):
    import shutil

    tls = tmp_path / "trainer-tls"
    tls.mkdir()
    for path in (two_orgs.client_cert, two_orgs.client_key):
        shutil.copy2(path, tls / path.name)
    cert, key = rotate(two_orgs.trainer_ca, tls / "client.pem", tls)
    assert (tls / "client.pem.bak").exists()
    target = f"localhost:{owner.port}"
    assert _info(client_settings(two_orgs, target, client_cert=cert, client_key=key)).heldout_size > 0


def test_ca_bundle_accepts_old_and_new_trainer_ca_during_a_ca_rotation(tmp_path, data_dir, two_orgs):
    new_ca = tmp_path / "new-trainer-ca"
    init_ca("trainer-org-2027", new_ca)
    new_cert, new_key = issue(new_ca, "client", "trainer", [], tmp_path / "new-client")
    bundle = tmp_path / "trainer-cas.pem"
    bundle.write_bytes(two_orgs.trainer_ca_cert.read_bytes() + (new_ca / "ca.pem").read_bytes())
    raw = owner_config(tmp_path / "storage", data_dir, two_orgs)
    raw["tls"]["ca_cert"] = str(bundle)
    with in_process_owner(raw, tmp_path) as running:
        target = f"localhost:{running.port}"
        assert _info(client_settings(two_orgs, target)).heldout_size > 0
        assert _info(client_settings(two_orgs, target, client_cert=new_cert, client_key=new_key)).heldout_size > 0


def _conformance_mtls(owner, two_orgs, ca_key, capsys) -> tuple[int, str, str]:
    from protocol.cli import main

    code = main(["conformance", "--target", f"localhost:{owner.port}", "--ca", str(two_orgs.owner_ca_cert),
                 "--cert", str(two_orgs.client_cert), "--key", str(two_orgs.client_key),
                 "--ca-key", str(ca_key), "--only", "mtls.*"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_conformance_certificate_checks_take_the_trainer_orgs_ca_key(owner, two_orgs, capsys):
    """In the two-CA setup the owner trusts the TRAINER org's CA for clients: with that key the expired and
    no-clientAuth checks run (and pass) against a server that also accepted the suite's control certificate."""
    code, out, _ = _conformance_mtls(owner, two_orgs, two_orgs.trainer_ca / "ca.key", capsys)
    assert code == 0, out
    for check in ("mtls.expired_certificate", "mtls.no_client_auth_usage", "mtls.foreign_ca"):
        row = next(line for line in out.splitlines() if check in line)
        assert "PASS" in row, row


def test_conformance_help_names_the_trainer_orgs_ca_key():
    import argparse

    from protocol.conformance.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "the key of the CA that issued --cert" in text and "TRAINER organization's ca.key" in text


def test_conformance_refuses_the_owner_orgs_ca_key_in_the_two_ca_setup(owner, two_orgs, capsys):
    """The owner's own CA key would mint certificates refused merely for their issuer: the checks would pass
    while testing nothing. The suite refuses such a key at start and says which key to pass."""
    code, _, err = _conformance_mtls(owner, two_orgs, two_orgs.owner_ca / "ca.key", capsys)
    assert code == 2 and "--ca-key did not sign --cert" in err and "TRAINER organization's ca.key" in err


def test_a_refused_control_certificate_fails_the_certificate_checks(monkeypatch):
    """Should the server refuse even a valid certificate minted with --ca-key, the refusals prove nothing."""
    import grpc

    from protocol.conformance.checks import mtls
    from protocol.conformance.registry import CheckFailed

    class Refusing(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAUTHENTICATED

        def details(self):
            return "no"

        def trailing_metadata(self):
            return ()

    class Stub:
        def GetInfo(self, request, timeout):
            raise Refusing()

    class Connection:
        stub = Stub()

        def close(self):
            pass

    class Context:
        def connect(self, identity, unique):
            return Connection()

    monkeypatch.setattr(mtls, "rogue", lambda ctx: type("Minted", (), {"valid_client": None})())
    monkeypatch.setattr(mtls, "_identity", lambda ctx, pair: None)
    with pytest.raises(CheckFailed, match="control certificate minted with --ca-key was refused too"):
        mtls.assert_control_accepted(Context())
