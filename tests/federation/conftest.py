"""Fixtures: one in-process owner node (FakeScorer: fast), reached over the direct gRPC port and
through the Flower shim; the owner fixtures are the owner tests' own."""

from __future__ import annotations

import importlib.util

import pytest

# The federation extra (flwr) is in the dev extra, so CI runs these; an environment without it
# (pip install -e . alone) does not collect them instead of failing to import flwr.
if importlib.util.find_spec("flwr") is None:
    collect_ignore_glob = ["test_*.py"]

from tests.target_owner_node.conftest import (  # noqa: F401 - fixtures
    FakeScorer,
    data_dir,
    make_config,
    pki,
    running_server,
    tiny_checkpoint,
)


def public_settings(port, owner_pki, **overrides):
    from protocol.public_client import PublicClientSettings

    return PublicClientSettings(target=f"127.0.0.1:{port}", ca_cert=owner_pki["ca_cert"],
                                client_cert=owner_pki["client_cert"], client_key=owner_pki["client_key"],
                                server_name="localhost", **overrides)


def direct_client(port, pki):  # noqa: F811
    from trainer_node.feedback.client import ClientSettings, TargetFeedbackClient

    return TargetFeedbackClient(ClientSettings(target=f"127.0.0.1:{port}", ca_cert=pki["ca_cert"],
                                               client_cert=pki["client_cert"], client_key=pki["client_key"],
                                               server_name="localhost", max_attempts=1))


def flower_client(port, pki, name="owner-a"):  # noqa: F811
    from flower_shim.app import make_client_app
    from trainer_node.federation.client import FlowerOwnerClient
    from trainer_node.federation.loopback_grid import LoopbackGrid

    grid = LoopbackGrid(make_client_app(lambda context: (name, public_settings(port, pki))), {7: {}})
    return FlowerOwnerClient(grid, 7, timeout_s=60)


@pytest.fixture()
def owner(tmp_path, data_dir, pki):  # noqa: F811
    from protocol.privacy.mechanisms import SeededRandom

    config = make_config(tmp_path, data_dir, pki, privacy={"planned_releases": 3, "epsilon_budget": 1.0})
    with running_server(config, scorer=FakeScorer(), random_source=SeededRandom(0)) as running:
        yield running


@pytest.fixture(params=["grpc", "flower"])
def transport(request, owner, pki):  # noqa: F811
    """The same OwnerClient contract over both transports."""
    client = direct_client(owner.port, pki) if request.param == "grpc" else flower_client(owner.port, pki)
    yield client
    client.close()
