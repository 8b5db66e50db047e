"""The bench as a superset of DataFlex-RL (seed 001): methods that name update-seam rules or
mixture policies, the three-family table with mixtures also against `static`, the
domain-balanced, macro and domain-heavy summaries of the `dataflex` testbed, and the Spearman
correlation of their rankings; plus the `dataflex` profiles."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as scipy_stats

from lab.bench.cli import write_outputs
from lab.bench.spec import BenchSpecError, load_profile, parse_spec, plan_runs
from tests.lab.test_bench_runner import run_fake_bench

FAMILIES = {"math_add": "math", "math_sub": "math", "math_mul": "math", "math_gcd": "math",
            "logic_syllogism": "logic", "logic_aiw": "logic", "logic_family": "logic",
            "text_count": "text", "text_spell": "text"}
MATH_HEAVY = ["math_add", "math_sub", "math_mul", "math_gcd", "text_count"]

SPEC = {
    "name": "dataflex-test", "seeds": [0, 1, 2], "steps": 4, "testbeds": ["dataflex"],
    "config": {"run": {"eval_every": 2}}, "family_controls": {"mixture": "static"},
    "methods": [
        {"label": "uniform"},
        {"label": "gfpo", "selection": "gfpo"},
        {"label": "maxvar", "selection": {"name": "maxvar", "keep_fraction": 0.4}},
        {"label": "per", "reweighting": "per"},
        {"label": "static", "policy": "static"},
        {"label": "reward_gap", "policy": "reward_gap"},
        {"label": "dapo", "policy": "dapo"},
    ],
}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("dataflex_bench")
    spec = parse_spec(SPEC)
    records, _ = run_fake_bench(spec, out)
    report = write_outputs(spec, records, out)
    return spec, records, report.read_text(), json.loads((out / "results.json").read_text())


def after(records, label):
    return {r["seed"]: r["summary"]["target_domain_accuracy_after"] for r in records if r["label"] == label}


def domain_balanced(domains):
    return np.mean([np.mean([v for b, v in domains.items() if FAMILIES[b] == f]) for f in ("logic", "math", "text")])


def test_a_method_names_a_rule_or_a_mixture_and_the_run_config_carries_it():
    spec = parse_spec(SPEC)
    configs = {run.label: run.config for run in plan_runs(spec) if run.seed == 0}
    assert configs["gfpo"]["grpo"]["selection"] == {"name": "gfpo"} and configs["gfpo"]["policy"]["name"] == "uniform"
    assert configs["maxvar"]["grpo"]["selection"] == {"name": "maxvar", "keep_fraction": 0.4}
    assert configs["per"]["grpo"]["reweighting"] == {"name": "per"}
    assert "selection" not in configs["uniform"].get("grpo", {})
    assert configs["reward_gap"]["policy"]["name"] == "reward_gap"
    families = {m.label: m.family() for m in spec.methods}
    assert families == {"uniform": None, "gfpo": "selection", "maxvar": "selection", "per": "reweighting",
                        "static": "mixture", "reward_gap": "mixture", "dapo": None}


@pytest.mark.parametrize(("change", "message"), [
    ({"methods": [{"label": "uniform"}, {"label": "x", "selection": "per"}]}, r"methods\[1\]\.selection\.name: unknown selection rule"),
    ({"methods": [{"label": "uniform"}, {"label": "x", "reweighting": {"name": "ar", "alpha": 3}}]},
     r"methods\[1\]\.reweighting\.alpha"),
    ({"methods": [{"label": "uniform", "config": {"grpo": {"selection": "gfpo"}}}]}, r"grpo\.selection is set by the bench"),
    ({"family_controls": {"mixtures": "static"}}, "family_controls: 'mixtures' is not a family"),
    ({"family_controls": {"mixture": "nope"}}, r"family_controls\.mixture: 'nope' is not a method label"),
])
def test_spec_errors_name_the_field(change, message):
    with pytest.raises(BenchSpecError, match=message):
        parse_spec({**SPEC, **change})


def test_the_headline_is_the_mean_over_domains_of_the_mean_over_their_benchmarks(bench):
    _, records, _, results = bench
    tb = results["testbeds"]["dataflex"]
    assert tb["families"] == ["logic", "math", "text"] and tb["grouped"] is True
    for label in ("uniform", "gfpo"):
        per_seed = tb["methods"][label]["per_seed"]
        for seed, domains in after(records, label).items():
            values = per_seed[str(seed)]
            assert values["balanced"] == pytest.approx(domain_balanced(domains))
            assert values["summaries"]["macro"] == pytest.approx(np.mean(list(domains.values())))
            assert values["summaries"]["math_heavy"] == pytest.approx(np.mean([domains[b] for b in MATH_HEAVY]))


def test_mixtures_are_paired_against_static_as_well_as_uniform(bench):
    _, records, report, results = bench
    methods = results["testbeds"]["dataflex"]["methods"]
    own = methods["reward_gap"]["delta_vs_family_control"]
    mixed = {s: domain_balanced(d) for s, d in after(records, "reward_gap").items()}
    static = {s: domain_balanced(d) for s, d in after(records, "static").items()}
    assert own["control"] == "static"
    assert own["mean"] == pytest.approx(np.mean([mixed[s] - static[s] for s in (0, 1, 2)]))
    assert "delta_vs_family_control" not in methods["static"] and "delta_vs_family_control" not in methods["gfpo"]
    assert "### DataFlex-RL's three families vs uniform" in report
    family_rows = [line for line in report.splitlines()
                   if line.startswith(("| Selection |", "| Reweighting |", "| Mixture adaptation |"))]
    assert [line.split(" | ")[1] for line in family_rows] == ["gfpo", "maxvar", "per", "static", "reward_gap"]
    assert "selection = maxvar {keep_fraction=0.4}" in report and "(vs static)" in report


def test_the_rank_correlation_of_the_summaries_is_spearmans_rho_over_the_main_methods(bench):
    _, records, report, results = bench
    sensitivity = results["testbeds"]["dataflex"]["evaluation_sensitivity"]
    labels = [m["label"] for m in SPEC["methods"]]
    assert sorted(sensitivity["methods"]) == sorted(labels)
    db = [np.mean([domain_balanced(d) for d in after(records, label).values()]) for label in labels]
    heavy = [np.mean([np.mean([d[b] for b in MATH_HEAVY]) for d in after(records, label).values()]) for label in labels]
    rho = scipy_stats.spearmanr(db, heavy).statistic
    item = sensitivity["summaries"]["math_heavy"]
    assert item["rho_vs_domain_balanced"] == pytest.approx(rho) and item["n_methods"] == len(labels)
    assert item["spread"] == pytest.approx(max(heavy) - min(heavy))
    assert sensitivity["summaries"]["domain_balanced"]["rho_vs_domain_balanced"] == pytest.approx(1.0)
    assert "### Evaluation summaries of the same runs, and their rank agreement" in report
    assert f"| math_heavy | mean over {', '.join(MATH_HEAVY)} | {rho:+.2f} (n = {len(labels)})" in report
    assert "### Per-benchmark accuracy" in report and "math_gcd (math)" in report


def test_table_1_shows_the_three_domain_means_not_the_nine_benchmarks(bench):
    _, _, report, _ = bench
    header = next(line for line in report.splitlines() if line.startswith("| Method | logic |"))
    assert "| logic | math | text | Bal. avg |" in header and "math_add" not in header


def test_the_control_learning_figure_shows_training_reward_per_domain_and_benchmarks_before_and_after(bench):
    _, records, report, results = bench
    uniform = results["testbeds"]["dataflex"]["methods"]["uniform"]
    reward = uniform["training_reward"]
    assert reward["steps"] == [0, 1, 2, 3] and reward["mean"] == pytest.approx([0.1] * 4)
    # the domain's series is the mean of its tasks' rewards (the fake: add = step / 4, mul = 0)
    assert reward["domains"]["math"] == pytest.approx([s / 8 for s in range(4)])
    assert reward["domains"]["logic"] == pytest.approx([0.5] * 4)
    before = {r["seed"]: r["summary"]["target_domain_accuracy_before"] for r in records if r["label"] == "uniform"}
    assert {int(s): v["domains_before"] for s, v in uniform["per_seed"].items()} == before
    assert "(control_learning_dataflex.png)" in report


def test_the_dataflex_profiles_run_the_twelve_configurations_beside_the_baselines():
    full, breadth = load_profile("dataflex"), load_profile("dataflex_breadth")
    assert len(full.seeds) == 12 and breadth.seeds == [0, 1, 2] and full.testbeds == breadth.testbeds == ["dataflex"]
    assert [m.model_dump() for m in full.methods] == [m.model_dump() for m in breadth.methods]
    assert full.config == breadth.config and full.steps == breadth.steps
    assert full.family_controls == {"mixture": "static"} and full.control == "uniform"
    families = {}
    for method in full.methods:
        families.setdefault(method.family(), []).append(method.label)
    assert families["selection"] == ["difffilter", "maxvar", "gfpo", "topk"]
    assert families["reweighting"] == ["ar", "per", "softmax", "diffband"]
    assert families["mixture"] == ["static", "reward_gap", "dump_ucb", "tscl"]
    assert families[None] == ["uniform", "l2rr", "dapo", "greso"]
    runs = plan_runs(breadth)  # validates every run config (rules and options included)
    assert len(runs) == 16 * 3 and len(plan_runs(full)) == 16 * 12
    config = runs[0].config
    assert config["policy"]["rollouts_per_prompt"] == 5 and config["grpo"]["kl_coef"] == 1e-3
    assert config["grpo"]["loss_aggregation"] == "seq_mean"
    # Seeds 0-2 of the full profile are the breadth runs (same config hash): one can extend the other.
    full_hashes = {(r.label, r.seed): r.config_hash for r in plan_runs(full) if r.seed < 3}
    assert all(full_hashes[(r.label, r.seed)] == r.config_hash for r in runs)


def test_the_rank_correlation_ranks_only_methods_with_every_seed():
    """A mean over fewer seeds is a mean over other initial policies: such a method is left out
    of the rankings (and named), not ranked against means over all seeds."""
    from lab.bench.results import evaluation_sensitivity

    def method(seeds, balanced, heavy):
        return {"group": "main", "seeds_ok": seeds,
                "summaries": {"domain_balanced": {"mean": balanced}, "math_heavy": {"mean": heavy}}}

    methods = {"uniform": method([0, 1, 2], 0.40, 0.30), "a": method([0, 1, 2], 0.42, 0.29),
               "b": method([0, 1, 2], 0.44, 0.31), "partial": method([0], 0.50, 0.10),
               "ablation": {**method([0, 1, 2], 0.1, 0.9), "group": "ablation"}}
    result = evaluation_sensitivity(methods, ["domain_balanced", "math_heavy"])
    assert result["methods"] == ["uniform", "a", "b"] and result["left_out"] == ["partial"]
    assert result["seeds"] == [0, 1, 2]
    heavy = result["summaries"]["math_heavy"]
    assert heavy["n_methods"] == 3 and heavy["rho_vs_domain_balanced"] == pytest.approx(0.5)
    assert heavy["best"] == "b"


def test_the_learning_table_pairs_each_benchmark_after_with_its_own_seeds_start(bench):
    """Issue 45's check: uniform's after - before per benchmark, paired per seed, with a t interval."""
    _, records, report, results = bench
    uniform = results["testbeds"]["dataflex"]["methods"]["uniform"]
    runs = {r["seed"]: r["summary"] for r in records if r["label"] == "uniform"}
    for benchmark in ("math_add", "text_count"):
        change = uniform["learning"]["domains"][benchmark]
        diffs = [runs[s]["target_domain_accuracy_after"][benchmark] - runs[s]["target_domain_accuracy_before"][benchmark]
                 for s in sorted(runs)]
        assert change["seeds"] == sorted(runs) and change["diffs"] == pytest.approx(diffs)
        half = scipy_stats.t.ppf(0.975, len(diffs) - 1) * np.std(diffs, ddof=1) / np.sqrt(len(diffs))
        assert change["t"]["low"] == pytest.approx(np.mean(diffs) - half)
    balanced = [domain_balanced(runs[s]["target_domain_accuracy_after"])
                - domain_balanced(runs[s]["target_domain_accuracy_before"]) for s in sorted(runs)]
    assert uniform["learning"]["balanced"]["diffs"] == pytest.approx(balanced)
    table = report.split("### Does the control learn?")[1].split("\n\n")[1].splitlines()
    assert table[0] == "| Method | balanced | " + " | ".join(sorted(FAMILIES, key=lambda b: (FAMILIES[b], b))) + " |"
    assert {line.split(" | ")[0].lstrip("| ") for line in table[2:]} == {m["label"] for m in SPEC["methods"]}


def test_a_change_equal_on_every_seed_is_not_starred_as_evidence():
    from lab.bench.report import _change_cell

    base = {"seeds": [0, 1], "mean": 0.05, "t": {"low": 0.05, "high": 0.05}, "excludes_zero": True}
    assert _change_cell({**base, "sd": 0.0}) == "+5.00 [+5.00, +5.00]"
    assert _change_cell({**base, "sd": 0.01, "t": {"low": 0.01, "high": 0.09}}) == "+5.00 [+1.00, +9.00] *"
    assert _change_cell(None) == "n/a"
