"""`target-owner-node launch`: a node config for one held-out file, for a suite-controlled owner.

The conformance suite's `--launch-cmd` contract: the suite writes a held-out file (with its
own marker rows), picks a port and brings its own PKI, then runs the launch command; the
owner serves that file on that port in the foreground, prints 'listening on HOST:PORT' when
ready and stops on SIGTERM/SIGINT, exactly like `serve`. This module only writes the config
(DIR/config.toml, rewritten from the options at every launch); DIR/storage is kept between
launches, so a relaunch resumes the same ledger and audit log (and restart checks can see a
deleted ledger). The test split is off; min_heldout_size is min(100, rows) so small suite
sets are served.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_core.configuration import default_of
from target_owner_node.config import PrivacyConfig


@dataclass(frozen=True)
class LaunchOptions:
    heldout: Path
    port: int
    workdir: Path
    ca: Path
    cert: Path
    key: Path
    dp: bool = True
    sample_rate: float = default_of(PrivacyConfig, "sample_rate")  # every default: the config model's
    epsilon: float = default_of(PrivacyConfig, "epsilon_budget")
    planned_releases: int = default_of(PrivacyConfig, "planned_releases")
    verifier: str = "per_example"
    prompt_template: str | None = None


def launch_config(options: LaunchOptions, heldout_rows: int) -> dict[str, dict[str, Any]]:
    """The config mapping of a launched node (see the module doc)."""
    workdir = options.workdir.resolve()
    data: dict[str, Any] = {
        "heldout_path": str(options.heldout.resolve()),
        "min_heldout_size": max(1, min(100, heldout_rows)),
        "verifier": options.verifier,
        "task_description": "held-out set served by `target-owner-node launch`",
        "test_split_enabled": False,
    }
    if options.prompt_template is not None:
        data["prompt_template"] = options.prompt_template
    return {
        "data": data,
        "evaluation": {"max_new_tokens": 64},
        "privacy": {
            "enabled": options.dp,
            "epsilon_budget": float(options.epsilon),
            "sample_rate": float(options.sample_rate),
            "planned_releases": int(options.planned_releases),
            "row_cap_tail": PrivacyConfig.tail_for(default_of(PrivacyConfig, "delta"), options.planned_releases),
        },
        "tls": {
            "ca_cert": str(options.ca.resolve()),
            "server_cert": str(options.cert.resolve()),
            "server_key": str(options.key.resolve()),
        },
        "server": {"listen_address": f"127.0.0.1:{options.port}", "drain_delay_s": 0.1},
        "storage": {"dir": str(workdir / "storage")},
    }


def write_launch_config(options: LaunchOptions) -> Path:
    """Count the held-out rows, then (re)write DIR/config.toml. Raises HeldoutError for a bad file."""
    from target_owner_node.heldout import load_split

    rows = len(load_split(options.heldout, options.verifier))
    options.workdir.mkdir(parents=True, exist_ok=True)
    path = options.workdir / "config.toml"
    path.write_text(to_toml(launch_config(options, rows)), encoding="utf-8")
    return path


def to_toml(sections: dict[str, dict[str, Any]]) -> str:
    """TOML for tables of strings, numbers and booleans (JSON scalars are valid TOML scalars)."""
    lines = ["# Written by `target-owner-node launch`; rewritten at every launch."]
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"
