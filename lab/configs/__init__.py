"""Packaged lab configs: simulate_default.toml, the embedded defaults of `trainer-node simulate`."""

from importlib import resources
from pathlib import Path


def simulate_defaults_path() -> Path:
    return Path(str(resources.files("lab.configs") / "simulate_default.toml"))
