"""Config validation: every error names the field and the fix; paths resolve next to the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from target_owner_node.config import ConfigError, load_config, parse_config

MINIMAL = """
[data]
heldout_path = "heldout.jsonl"
[storage]
dir = "storage"
[tls]
ca_cert = "pki/ca.pem"
server_cert = "pki/server.pem"
server_key = "pki/server.key"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_minimal_config_gets_defaults_and_resolves_paths(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL))
    assert config.data.heldout_path == tmp_path / "heldout.jsonl"
    assert config.storage.dir == tmp_path / "storage"
    assert config.tls.ca_cert == tmp_path / "pki" / "ca.pem"
    assert config.privacy.enabled and config.privacy.accountant == "rdp"
    assert config.server.insecure is False and config.tls.require_client_auth is True


@pytest.mark.parametrize(
    "section, line, expected",
    [
        ("privacy", "delta = 2", "privacy.delta: must be in (0, 1); got 2"),
        ("privacy", "epsilon_budget = -1", "privacy.epsilon_budget: must be a positive"),
        ("privacy", "sample_rate = 0", "privacy.sample_rate: must be in (0, 1]"),
        ("privacy", 'accountant = "gdp"', "privacy.accountant: unknown accountant 'gdp'; known: prv, rdp"),
        ("privacy", "noise_multiplier = 1.0", "privacy.noise_multiplier: unknown setting"),
        (
            "evaluation",
            "max_candidates_per_query = 0",
            "evaluation.max_candidates_per_query: must be at least 1",
        ),
        ("server", 'listen_address = "nope"', "server.listen_address: must look like HOST:PORT"),
        ("data", 'verifier = "regex"', "data.verifier: must be one of per_example"),
    ],
)
def test_errors_name_the_field(tmp_path, section, line, expected):
    text = (
        MINIMAL + f"\n[{section}]\n{line}\n"
        if f"[{section}]" not in MINIMAL
        else MINIMAL.replace(f"[{section}]", f"[{section}]\n{line}")
    )
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text))
    assert expected in str(caught.value)


def test_missing_required_setting_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.heldout_path: required"):
        load_config(_write(tmp_path, MINIMAL.replace('heldout_path = "heldout.jsonl"', "")))


def test_insecure_refused_off_loopback_and_tls_required_otherwise(tmp_path):
    raw = {
        "data": {"heldout_path": "h.jsonl"},
        "storage": {"dir": "s"},
        "server": {"listen_address": "0.0.0.0:50051", "insecure": True},
    }
    with pytest.raises(ConfigError, match=r"server\.insecure: true is only allowed on a loopback"):
        parse_config(raw, tmp_path)
    raw["server"]["listen_address"] = "127.0.0.1:50051"
    assert parse_config(raw, tmp_path).server.insecure
    del raw["server"]
    with pytest.raises(ConfigError, match=r"\[tls\] section is required"):
        parse_config(raw, tmp_path)


def test_missing_file_and_bad_toml_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "[data\n"))


def test_state_marker_defaults_next_to_the_config_outside_storage(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL))
    assert config.storage.state_marker_path == tmp_path / ".target-owner-node-state.json"
    assert not config.storage.state_marker_explicit
    named = load_config(_write(tmp_path, MINIMAL.replace('dir = "storage"', 'dir = "storage"\nstate_marker = "m.json"')))
    assert named.storage.state_marker_path == tmp_path / "m.json" and named.storage.state_marker_explicit
    inside = MINIMAL.replace('dir = "storage"', 'dir = "storage"\nstate_marker = "storage/m.json"')
    with pytest.raises(ConfigError, match=r"storage: state_marker .* must lie outside storage.dir"):
        load_config(_write(tmp_path, inside))


def test_test_split_is_off_unless_switched_on(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL.replace("[data]", '[data]\ntest_path = "test.jsonl"')))
    assert config.data.test_path == tmp_path / "test.jsonl" and config.data.test_split_enabled is False
    enabled = MINIMAL.replace("[data]", "[data]\ntest_split_enabled = true")
    with pytest.raises(ConfigError, match=r"data: test_split_enabled = true requires data\.test_path"):
        load_config(_write(tmp_path, enabled))


def test_state_marker_default_moves_beside_a_storage_dir_that_holds_the_config(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL.replace('dir = "storage"', 'dir = "."')))
    assert config.storage.state_marker_path == tmp_path.parent / ".target-owner-node-state.json"


def test_accountant_is_any_registered_accountant(monkeypatch):
    # Validated against the accountant registry, not a hard-coded list: a plug-in's name is accepted.
    from protocol.privacy import accountants
    from target_owner_node.config import PrivacyConfig

    scratch = accountants.ACCOUNTANTS.copy()
    scratch.register("mine")(type("Mine", (accountants.RdpAccountant,), {}))
    monkeypatch.setattr(accountants, "ACCOUNTANTS", scratch)
    assert PrivacyConfig(accountant="mine").accountant == "mine"
    with pytest.raises(ValueError, match="unknown accountant 'gdp'; known: mine, prv, rdp"):
        PrivacyConfig(accountant="gdp")


def test_every_setting_is_documented_one_way():
    from rlvr_core.configuration import undocumented_fields
    from target_owner_node.config import OwnerConfig

    assert undocumented_fields(OwnerConfig) == []


def test_privacy_defaults_have_one_definition_the_config_model(tmp_path):
    import inspect

    from rlvr_core.configuration import default_of
    from target_owner_node.cli import build_parser
    from target_owner_node.config import EvaluationConfig, PrivacyConfig
    from target_owner_node.launch import LaunchOptions
    from target_owner_node.scaffold import init_node

    model = {"epsilon": "epsilon_budget", "sample_rate": "sample_rate", "planned_releases": "planned_releases"}
    init_defaults = inspect.signature(init_node).parameters
    launch_defaults = inspect.signature(LaunchOptions).parameters
    for argument, field in model.items():
        expected = default_of(PrivacyConfig, field)
        assert init_defaults[argument].default == expected and launch_defaults[argument].default == expected
    assert init_defaults["max_prompt_tokens"].default == default_of(EvaluationConfig, "max_prompt_tokens")
    parser = build_parser()
    for command in (["init", "d"], ["launch", "--heldout", "h", "--port", "0", "--workdir", "w", "--ca", "c",
                                    "--cert", "c", "--key", "k"]):
        args = parser.parse_args(command)
        assert (args.epsilon, args.sample_rate, args.planned_releases) == tuple(
            default_of(PrivacyConfig, field) for field in model.values())
    written = load_config(init_node(tmp_path / "node", testbed="small").config_path)
    assert written.privacy == PrivacyConfig()  # a fresh node gets exactly the model's privacy defaults
