"""The test split switch (issue 11, hole 6): off unless data.test_split_enabled, which needs
test_path and the declared, public data.test_domains; rows with undeclared domains stop the
node (naming the row's position, never its content); `init` writes it off unless
--enable-test-split; GetInfo publishes the declared domains."""

from __future__ import annotations

import grpc
import pytest

from protocol import errors
from protocol.errors import reason_of
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.io import write_examples
from target_owner_node.config import ConfigError, load_config
from target_owner_node.node import NodeStartupError, open_node

from .conftest import (
    TEST_DOMAINS,
    TEST_SIZE,
    FakeScorer,
    RecordingClient,
    config_dict,
    make_config,
    running_server,
)


def test_test_path_alone_no_longer_serves_the_test_split(tmp_path, data_dir, pki):
    config = make_config(tmp_path, data_dir, pki, data={"test_split_enabled": False})
    assert config.data.test_path is not None
    node = open_node(config, scorer=FakeScorer())
    assert node.facts.test_domains is None and node.facts.test_size == 0
    node.close()


def test_the_switch_is_off_by_default(tmp_path):
    from target_owner_node.config import DataConfig

    assert (
        DataConfig(heldout_path=tmp_path / "h.jsonl", test_path=tmp_path / "t.jsonl").test_split_enabled
        is False
    )


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"test_path": None}, "test_split_enabled = true requires data.test_path"),
        ({"test_domains": None}, "test_split_enabled = true requires data.test_domains"),
        ({"test_domains": []}, "test_split_enabled = true requires data.test_domains"),
        ({"test_domains": ["easy", "easy"]}, "data.test_domains: domain names must be unique"),
        ({"test_domains": ["easy", " "]}, "data.test_domains: every domain name must be a non-empty string"),
    ],
)
def test_enabling_needs_a_path_and_declared_domains(tmp_path, data_dir, pki, data, expected):
    from .conftest import write_toml

    raw = config_dict(tmp_path, data_dir, pki)
    for key, value in data.items():
        if value is None:
            raw["data"].pop(key)
        else:
            raw["data"][key] = value
    with pytest.raises(ConfigError) as caught:
        load_config(write_toml(tmp_path / "config.toml", raw))
    assert expected in str(caught.value)


def test_an_undeclared_domain_stops_the_node_naming_the_position_only(tmp_path, data_dir, pki):
    rows = [
        Example(id=f"t{i}", prompt="1+1=", answer="2", domain="easy", verifier="exact_match")
        for i in range(5)
    ]
    rows[3] = Example(id="t3", prompt="1+1=", answer="2", domain="SECRETDOMAINZQX", verifier="exact_match")
    write_examples(tmp_path / "test.jsonl", rows)
    config = make_config(tmp_path, data_dir, pki, data={"test_path": str(tmp_path / "test.jsonl")})
    with pytest.raises(NodeStartupError) as caught:
        open_node(config, scorer=FakeScorer())
    message = str(caught.value)
    assert "row 3 (0-based)" in message and "data.test_domains" in message and "data.test_path" in message
    assert "SECRETDOMAINZQX" not in message


def test_getinfo_publishes_the_declared_domains_and_only_they_are_keys(
    tmp_path, data_dir, pki, tiny_checkpoint
):
    config = make_config(tmp_path, data_dir, pki, data={"test_domains": [*TEST_DOMAINS, "unused"]})
    with running_server(config, scorer=FakeScorer()) as running:
        client = RecordingClient(running.port, pki)
        try:
            info = client.info()
            assert info.test_split_enabled and info.test_size == TEST_SIZE
            assert list(info.test_domains) == [*TEST_DOMAINS, "unused"]
            checkpoint_id = client.upload_dir(tiny_checkpoint).checkpoint_id
            result = client.evaluate([checkpoint_id], split=pb.SPLIT_TEST).results[0]
            assert set(result.domain_accuracy) <= set(info.test_domains)
        finally:
            client.close()


@pytest.fixture(scope="module")
def init_nodes(tmp_path_factory):
    """`target-owner-node init` twice on the small testbed: default, and --enable-test-split."""
    from target_owner_node.cli import main

    root = tmp_path_factory.mktemp("init")
    assert main(["init", str(root / "default"), "--testbed", "small"]) == 0
    assert main(["init", str(root / "enabled"), "--testbed", "small", "--enable-test-split"]) == 0
    return root


def _info_and_test_split(node_dir, tiny_checkpoint):
    config = load_config(node_dir / "config.toml")
    pki = {
        "ca_cert": node_dir / "pki" / "ca.pem",
        "client_cert": node_dir / "pki" / "client.pem",
        "client_key": node_dir / "pki" / "client.key",
    }
    with running_server(config, scorer=FakeScorer()) as running:
        client = RecordingClient(running.port, pki)
        try:
            info = client.info()
            checkpoint_id = client.upload_dir(tiny_checkpoint).checkpoint_id
            try:
                outcome = client.evaluate([checkpoint_id], split=pb.SPLIT_TEST).results[0]
            except grpc.RpcError as error:
                outcome = (error.code(), reason_of(error))
            return config, info, outcome
        finally:
            client.close()


def test_init_writes_the_test_split_off(init_nodes, tiny_checkpoint):
    config, info, outcome = _info_and_test_split(init_nodes / "default", tiny_checkpoint)
    assert config.data.test_split_enabled is False and config.data.test_path.is_file()
    assert not info.test_split_enabled and info.test_size == 0 and not info.test_domains
    assert outcome == (grpc.StatusCode.INVALID_ARGUMENT, errors.TEST_SPLIT_DISABLED)


def test_init_enable_test_split_serves_it_with_the_testbeds_declared_domains(init_nodes, tiny_checkpoint):
    from rlvr_core.tasks.testbed import load_testbed

    config, info, outcome = _info_and_test_split(init_nodes / "enabled", tiny_checkpoint)
    declared = sorted({entry.domain for entry in load_testbed("small").target})
    assert config.data.test_split_enabled is True and config.data.test_domains == declared
    assert info.test_split_enabled and list(info.test_domains) == declared and info.test_size > 0
    assert set(outcome.domain_accuracy) <= set(declared) and outcome.domain_accuracy
