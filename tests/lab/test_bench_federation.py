"""The federation bench profile: L2RR on the aggregate vs uniform vs per-owner L2RR, matched seeds,
three owners per run (`simulate --owners 3`)."""

import json
from pathlib import Path

import pytest

from lab.bench.runner import simulate_command
from lab.bench.spec import load_profile, plan_runs


def test_the_federation_profile_compares_aggregate_uniform_and_per_owner_l2rr_on_matched_seeds():
    spec = load_profile("federation")
    runs = plan_runs(spec)
    assert {r.label for r in runs} == {"uniform", "l2rr_aggregate", "l2rr_owner0"}
    seeds = {label: sorted(r.seed for r in runs if r.label == label) for label in ("uniform", "l2rr_aggregate")}
    assert seeds["uniform"] == seeds["l2rr_aggregate"] == [0, 1, 2]
    by_label = {r.label: r for r in runs if r.seed == 0}
    assert by_label["l2rr_owner0"].config["owners"] == {"name": "per_owner", "owner": "owner0"}
    assert by_label["l2rr_aggregate"].config["owners"] == {"name": "heldout_size"}
    argv = simulate_command(by_label["l2rr_aggregate"], Path("run"), Path("c.toml"))
    assert argv[argv.index("--owners") + 1] == "3"
    assert by_label["uniform"].config_hash != by_label["l2rr_aggregate"].config_hash


def owner_summary(seed: int, bonus: float, lost_owner: str | None = None) -> dict:
    """A `simulate --owners 3` summary.json on dataflex: each owner measured its own family's benchmarks."""
    from lab.federation import merged_domains

    family_of = {"owner0": ["logic_aiw", "logic_family", "logic_syllogism"],
                 "owner1": ["math_add", "math_gcd", "math_mul", "math_sub"], "owner2": ["text_count", "text_spell"]}
    owners = {}
    for index, (name, benchmarks) in enumerate(family_of.items()):
        after = None if name == lost_owner else {b: 0.1 * index + 0.01 * i + bonus + 0.001 * seed
                                                 for i, b in enumerate(benchmarks)}
        owners[name] = {"target_domains": benchmarks, "target_accuracy_before": 0.2,
                        "target_accuracy_after": None if after is None else sum(after.values()) / len(after),
                        "target_domain_accuracy_before": dict.fromkeys(benchmarks, 0.2),
                        "target_domain_accuracy_after": after, "epsilon_spent": 2.0 + index,
                        "lost_step": 3 if name == lost_owner else None}
    measured = [o["target_accuracy_after"] for o in owners.values() if o["target_accuracy_after"] is not None]
    return {"target_accuracy_before": 0.2, "target_accuracy_after": sum(measured) / len(measured), "rollouts": 100,
            "owners": owners, "target_domain_accuracy_before": merged_domains(owners, "before"),
            "target_domain_accuracy_after": merged_domains(owners, "after"), "epsilon_spent": 4.0}


def test_a_multi_owner_bench_fills_the_per_benchmark_and_per_owner_tables_from_each_summary(tmp_path):
    from lab.bench.cli import write_outputs
    from lab.bench.spec import parse_spec, testbed_key

    spec = parse_spec({"name": "fed", "seeds": [0, 1], "steps": 2, "testbeds": ["dataflex"], "owners": 3,
                       "methods": [{"label": "uniform"}, {"label": "l2rr", "policy": "l2rr"}]})
    records = [{"label": label, "seed": seed, "status": "ok", "testbed_key": testbed_key("dataflex"),
                "summary": owner_summary(seed, bonus, lost_owner="owner2" if (label, seed) == ("l2rr", 1) else None)}
               for label, bonus in (("uniform", 0.0), ("l2rr", 0.05)) for seed in (0, 1)]
    report = write_outputs(spec, records, tmp_path).read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    methods = results["testbeds"][testbed_key("dataflex")]["methods"]
    assert methods["uniform"]["domains"]["math_gcd"]["mean"] == pytest.approx(0.1 + 0.01 + 0.0005)
    assert methods["l2rr"]["domains"]["text_count"]["n"] == 1  # owner2 was lost in one of l2rr's runs
    owners = methods["l2rr"]["owners"]
    assert owners["owner2"]["lost_runs"] == 1 and owners["owner2"]["accuracy"]["n"] == 1
    assert owners["owner1"]["epsilon_spent"]["mean"] == pytest.approx(3.0)
    benchmark_rows = [line for line in report.split("### Per-benchmark accuracy")[1].splitlines()
                      if line.startswith("| uniform |")]
    assert benchmark_rows and "n/a" not in benchmark_rows[0]  # filled, one owner's split per benchmark
    assert "### Per-owner accuracy and budget" in report and "owner1 (math)" in report
    assert "lost in 1 of 2" in report
