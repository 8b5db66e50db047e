"""The conformance suite's RPC-level checks (contract, budget, noise, leaks) through the Flower
path: GetInfo, GetBudget and Evaluate travel as Flower messages through the shim to the project's
real owner server (`target-owner-node serve`, real worker and accountant). The transport checks
(mTLS, chunked uploads, fuzz, restarts, health) stay on the owner's direct port, which the shim
itself uses, and are not re-run here (tests/protocol/test_conformance_project.py)."""

from __future__ import annotations

import pytest

from protocol.conformance.context import SuiteContext
from protocol.conformance.options import SuiteOptions
from protocol.conformance.registry import select_checks
from protocol.conformance.runner import FAIL, PASS, _run_one
from tests.federation.flower_stub import FlowerStub
from tests.protocol import conformance_harness as harness
from trainer_node.federation.loopback_grid import LoopbackGrid

# Every RPC-level check that needs neither a restart, a second owner launch, raw upload streams,
# other TLS identities nor other connections (those are the transport's).
RPC_CHECKS = [
    "rpc.get_info.contract", "rpc.get_info.public_fields_only", "rpc.get_budget.contract",
    "info.fixed_shape_declared", "info.test_domains_declared",
    "rpc.evaluate.contract", "rpc.evaluate.multi_candidate", "rpc.evaluate.unknown_checkpoint",
    "rpc.evaluate.decoding_out_of_limits", "rpc.evaluate.too_many_candidates", "rpc.evaluate.empty_candidates",
    "rpc.evaluate.split", "evaluate.refuse.charge_then_fail",
    "budget.idempotent_request_id", "budget.monotonic",
    "privacy.noise.present", "privacy.noise.not_excessive",
    "rpc.errors.error_info", "privacy.responses.schema_only", "privacy.canaries.absent",
    "budget.exhaustion",
]
PRIVACY = {"epsilon_budget": 1.0, "planned_releases": 36, "sample_rate": 0.1}


@pytest.fixture
def project_server(tmp_path, tmp_path_factory):
    node = harness.copy_node(harness.base_node(tmp_path_factory), tmp_path / "node", **PRIVACY)
    port = harness.free_port()
    harness.start(node.dir, port)
    try:
        yield node, port
    finally:
        harness.stop(node.dir)


def test_the_rpc_level_checks_pass_through_the_flower_shim(project_server):
    from flower_shim.app import make_client_app
    from protocol.public_client import PublicClientSettings

    node, port = project_server
    options = SuiteOptions(target=f"127.0.0.1:{port}", ca=node.ca, cert=node.cert, key=node.key,
                           canaries=list(node.canaries), allow_exhaust=True, noise_releases=14, only=RPC_CHECKS)
    settings = PublicClientSettings(target=f"127.0.0.1:{port}", ca_cert=node.ca, client_cert=node.cert,
                                    client_key=node.key, server_name=None)
    grid = LoopbackGrid(make_client_app(lambda context: ("owner", settings)), {3: {}})
    context = SuiteContext(options)
    context.conn.stub = FlowerStub(grid, 3, context.conn.stub, context.recorder)
    try:
        checks = select_checks(RPC_CHECKS)
        assert sorted(c.id for c in checks) == sorted(RPC_CHECKS)
        results = [_run_one(check, context) for check in checks]
    finally:
        context.close()
    failed = [f"{r.id}: {r.detail}" for r in results if r.result == FAIL]
    assert failed == []
    assert {r.id: r.result for r in results} == dict.fromkeys(RPC_CHECKS, PASS)  # nothing skipped either
    flower_calls = [m for m in grid.sent if m.metadata.message_type == "query.evaluate"]
    assert len(flower_calls) >= 14, "the releases went through Flower"
