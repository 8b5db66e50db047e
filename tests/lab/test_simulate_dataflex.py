"""`trainer-node simulate --method NAME` runs every DataFlex-RL configuration: a name stands for a
data policy or an update-seam rule, resolved through the registries (lab/simulate.py)."""

from __future__ import annotations

import json

import pytest

from lab.simulate import SimulateOptions, method_names, method_overrides, resolve_config
from tests.lab.test_simulate import _tiny_sim_config
from trainer_node.cli import main

DATAFLEX = ["difffilter", "maxvar", "gfpo", "topk", "ar", "per", "softmax", "diffband",
            "static", "reward_gap", "dump_ucb", "tscl"]


def test_every_dataflex_configuration_is_a_simulate_method():
    assert set(DATAFLEX) <= set(method_names())
    assert method_overrides("gfpo") == {"policy.name": "uniform", "grpo.selection": {"name": "gfpo"}}
    assert method_overrides("per") == {"policy.name": "uniform", "grpo.reweighting": {"name": "per"}}
    assert method_overrides("tscl") == {"policy.name": "tscl"}
    with pytest.raises(ValueError, match="neither a data policy nor an update rule"):
        method_overrides("nope")


@pytest.mark.parametrize("name", DATAFLEX)
def test_each_configuration_resolves_to_a_valid_run_config(tmp_path, name):
    config = _tiny_sim_config(tmp_path, tmp_path / "run", "l2rr")
    resolved = resolve_config(SimulateOptions(method=name, config=config))
    rules = {seam: getattr(resolved.grpo, seam) for seam in ("selection", "reweighting")}
    if name in ("static", "reward_gap", "dump_ucb", "tscl"):
        assert resolved.policy.name == name and rules == {"selection": None, "reweighting": None}
    else:
        assert resolved.policy.name == "uniform"
        assert {seam: rule.name for seam, rule in rules.items() if rule is not None} in (
            {"selection": name}, {"reweighting": name})


def test_simulate_runs_a_selection_rule_end_to_end_and_says_so(tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = _tiny_sim_config(tmp_path, run_dir, "l2rr", steps=2)
    assert main(["simulate", "--config", str(config), "--method", "topk", "--no-dp", "--no-progress"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["method"] == "uniform" and summary["update_rules"] == {"selection": "topk"}
    resolved = json.loads((run_dir / "resolved_config.json").read_text())
    assert resolved["grpo"]["selection"] == {"name": "topk", "fraction": 0.5}
    train = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert all(r["update/kept_frac"] == pytest.approx(0.5) for r in train)
    assert "simulate: uniform + selection topk on testbed 'small'" in capsys.readouterr().out
