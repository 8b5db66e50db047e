"""Packaged lab configs: simulate_default.toml, the embedded defaults of `trainer-node simulate`."""

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from trainer_node.config import ConfigError


def simulate_defaults_path() -> Path:
    return Path(str(resources.files("lab.configs") / "simulate_default.toml"))


def read_run_config(path: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run config TOML as a raw dict, with {"run.steps": 5}-style overrides set (None skipped),
    before validation: the lab fills in what only a simulation knows, then parse_config."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        *sections, leaf = key.split(".")
        node = raw
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ConfigError(f"cannot override {key!r}: {section!r} is not a section")
        node[leaf] = value
    return raw
