"""The conformance suite catches violations: run against deliberately broken versions of the
project's own server, it FAILS each one on the check aimed at that violation - and the same
checks PASS against the unbroken server (control)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from protocol.conformance import SuiteOptions, run_suite
from target_owner_node import logs
from tests.protocol import broken_servers as broken
from tests.protocol import conformance_harness as harness
from tests.protocol.conformance_harness import NodeSetup, copy_node

# broken server -> (the check aimed at it, words its failure detail must contain)
TARGETED = {
    "leaky_errors": ("privacy.canaries.absent", "error message"),
    "no_noise": ("privacy.noise.present", "identical"),
    "forgets_budget": ("budget.persists_across_restart", "after the restart epsilon_spent is 0"),
    "no_client_cert": ("mtls.no_client_certificate", "succeeded"),
    "accepts_pickle": ("upload.refuse.pickle_bin", "upload succeeded"),
}


@pytest.fixture(scope="module")
def base_node(tmp_path_factory) -> Path:
    """One `target-owner-node init --testbed small` with canaries; each test copies it."""
    return harness.base_node(tmp_path_factory)


@pytest.fixture(autouse=True)
def _fast_quiet(monkeypatch):
    broken.fast_exact_rdp(monkeypatch)
    logs.configure(enabled=False)
    yield
    logs.configure(enabled=True)


@dataclass
class Case:
    server: broken.InProcessServer
    node: NodeSetup


def build(base: Path, tmp_path: Path, kind: str, monkeypatch) -> Case:
    """The real server, broken in one way (kind), on a fresh copy of the node folder."""
    node = copy_node(base, tmp_path / "node", planned_releases=40, sample_rate=0.5)
    config = broken.node_config(node.dir)
    server = broken.InProcessServer(config)
    if kind == "leaky_errors":
        server.mutate = broken.leaky_errors(node.canaries[0])
    elif kind == "no_noise":
        server.random_source = broken.ZeroNoise()
    elif kind == "forgets_budget":
        server.on_restart = broken.wipe_storage
    elif kind == "no_client_cert":
        server.config = broken.without_client_auth(config, monkeypatch)
        server.mutate = broken.anonymous_clients
    elif kind == "accepts_pickle":
        broken.accept_pickle(monkeypatch)
    elif kind != "control":
        raise ValueError(kind)
    return Case(server.start(), node)


def run_checks(case: Case, only: list[str]) -> dict:
    node = case.node
    options = SuiteOptions(
        target=case.server.target, ca=node.ca, cert=node.cert, key=node.key, ca_key=node.ca_key,
        canaries=list(node.canaries), restart=case.server.restart, only=only, noise_releases=12,
    )
    try:
        return run_suite(options).by_id()
    finally:
        case.server.stop()


@pytest.mark.parametrize("kind", sorted(TARGETED))
def test_suite_fails_the_broken_server_on_the_aimed_check(kind, base_node, tmp_path, monkeypatch):
    check_id, words = TARGETED[kind]
    result = run_checks(build(base_node, tmp_path, kind, monkeypatch), [check_id])[check_id]
    assert result.result == "FAIL", f"{kind}: {check_id} gave {result.result}: {result.detail}"
    assert words in result.detail, result.detail


def test_the_aimed_checks_pass_against_the_unbroken_server(base_node, tmp_path, monkeypatch):
    aimed = sorted(check_id for check_id, _ in TARGETED.values())
    results = run_checks(build(base_node, tmp_path, "control", monkeypatch), aimed)
    failed = {i: f"{r.result}: {r.detail}" for i, r in results.items() if r.result != "PASS"}
    assert not failed, failed
    assert sorted(results) == aimed

