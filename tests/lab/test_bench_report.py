import json
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from lab.bench.cli import write_outputs
from lab.bench.spec import parse_spec
from tests.lab.test_bench_runner import run_fake_bench

SPEC = {
    "name": "report-test", "seeds": [0, 1, 2], "steps": 6, "config": {"run": {"eval_every": 2}},
    "methods": [
        {"label": "uniform", "policy": "uniform"},
        {"label": "dapo", "policy": "dapo"},
        {"label": "l2rr", "policy": "l2rr"},
        {"label": "l2rr-no-waste", "policy": "l2rr", "group": "ablation", "options": {"waste_penalty": False}},
        {"label": "l2rr-lambda1.0", "policy": "l2rr", "group": "sweep", "options": {"lambda_waste": 1.0}},
    ],
}


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    spec = parse_spec(SPEC)
    records, _ = run_fake_bench(spec, out)
    report = write_outputs(spec, records, out)
    return out, records, report.read_text(), json.loads((out / "results.json").read_text())


def balanced(records, label):
    """Hand-computed per-seed balanced accuracy of `label`, from the records."""
    return {r["seed"]: np.mean(list(r["summary"]["target_domain_accuracy_after"].values()))
            for r in records if r["label"] == label}


def row(report, label):
    return next(line for line in report.splitlines() if line.startswith(f"| {label} |"))


def test_table1_row_shows_the_numbers_of_the_records(bench_out):
    _, records, report, _ = bench_out
    l2rr, control = balanced(records, "l2rr"), balanced(records, "uniform")
    values = list(l2rr.values())
    line = row(report, "l2rr")
    assert f"{100 * np.mean(values):.1f} ± {100 * np.std(values, ddof=1):.1f}" in line
    add = [r["summary"]["target_domain_accuracy_after"]["add"] for r in records if r["label"] == "l2rr"]
    assert f"{100 * np.mean(add):.1f} ± {100 * np.std(add, ddof=1):.1f}" in line
    diffs = np.array([l2rr[s] - control[s] for s in (0, 1, 2)])
    half = scipy_stats.t.ppf(0.975, 2) * diffs.std(ddof=1) / math.sqrt(3)
    assert f"{100 * diffs.mean():+.2f}" in line
    assert f"[{100 * (diffs.mean() - half):+.2f}, {100 * (diffs.mean() + half):+.2f}]" in line
    rollouts = [r["summary"]["rollouts"] for r in records if r["label"] == "l2rr"]
    control_rollouts = [r["summary"]["rollouts"] for r in records if r["label"] == "uniform"]
    assert f"{np.mean(rollouts):,.0f}" in line and f"{np.mean(control_rollouts) / np.mean(rollouts):.2f}×" in line
    assert " | yes | " in line and line.rstrip(" |").endswith(" | 3")  # the fake's L2RR bonus is far above its noise
    assert "(control)" in row(report, "uniform")


def test_tables_2_and_sweep_and_reach_are_present(bench_out):
    _, _, report, results = bench_out
    assert "### Table 2: ablations (each beside its full method)" in report
    assert "| l2rr (full) |" in report and "| l2rr-no-waste |" in report
    table1 = report.split("### Table 1")[1].split("### Table 2")[0]
    assert "l2rr-no-waste" not in table1 and "l2rr-lambda1.0" not in table1
    sweep = report.split("λ sweep")[1]
    assert "| 1 | l2rr-lambda1.0 |" in sweep and "| 0.25 | l2rr |" in sweep
    assert "Rollouts to reach uniform's final accuracy" in report
    methods = results["testbeds"]["default"]["methods"]
    # The fake's uniform never beats its own final mean before the end: reached at its last eval.
    assert methods["uniform"]["reach_control"]["mean_curve"] == 6 * 64
    assert methods["l2rr"]["reach_control"]["mean_curve"] < 6 * 40  # better per rollout: earlier


def test_results_json_holds_every_per_seed_record_and_the_statistics(bench_out):
    _, records, _, results = bench_out
    assert len(results["runs"]) == len(records) == 15 and results["run_counts"] == {"ok": 15}
    l2rr = results["testbeds"]["default"]["methods"]["l2rr"]
    assert set(l2rr["per_seed"]) == {"0", "1", "2"}
    assert l2rr["delta_vs_control"]["seeds"] == [0, 1, 2] and l2rr["delta_vs_control"]["excludes_zero"]
    assert l2rr["ro_ratio"] == pytest.approx(64 / 40)
    assert l2rr["dynamics"]["steps"] == list(range(6)) and "add:medium" in l2rr["dynamics"]["q"]
    assert [p["step"] for p in l2rr["curve"]] == [0, 2, 4, 6]


def test_p_holm_adjusts_over_every_comparison_with_the_control(bench_out):
    _, records, report, results = bench_out
    methods = results["testbeds"]["default"]["methods"]
    control = balanced(records, "uniform")
    raw = {}
    for label in ("dapo", "l2rr", "l2rr-no-waste", "l2rr-lambda1.0"):  # every method but the control
        mine = balanced(records, label)
        raw[label] = scipy_stats.ttest_1samp([mine[s] - control[s] for s in (0, 1, 2)], 0.0).pvalue
        assert methods[label]["delta_vs_control"]["p_t"] == pytest.approx(raw[label])
    order = sorted(raw, key=raw.get)
    by_hand, running = {}, 0.0
    for rank, label in enumerate(order):  # Holm: (m - rank) * p, kept monotone, capped at 1
        running = max(running, min(1.0, (len(order) - rank) * raw[label]))
        by_hand[label] = running
    for label, expected in by_hand.items():
        delta = methods[label]["delta_vs_control"]
        assert delta["p_holm"] == pytest.approx(expected) and delta["holm_family_size"] == 4
    shown = by_hand["l2rr"]
    assert (f" | {shown:.3f} | " if shown >= 0.001 else " | <0.001 | ") in row(report, "l2rr")
    assert "p (Holm)" in report.split("### Table 1")[1].splitlines()[2]
    assert "**p (Holm)**" in report


def test_figures_are_written_and_linked(bench_out):
    out, _, report, _ = bench_out
    for name in ("accuracy_vs_rollouts_default.png", "lambda_sweep_default.png", "sampling_share_default.png"):
        assert (out / name).stat().st_size > 1000
        assert f"({name})" in report


def test_failed_runs_are_listed_and_left_out_of_the_statistics(tmp_path):
    spec = parse_spec({**SPEC, "seeds": [0, 1], "methods": [
        SPEC["methods"][0], {"label": "broken", "policy": "uniform"}]})
    records, _ = run_fake_bench(spec, tmp_path)
    report = write_outputs(spec, records, tmp_path).read_text()
    assert "## Runs without results" in report and "| default__broken__seed0 | failed | exit code 3 |" in report
    assert row(report, "broken").endswith("| n/a | n/a | n/a | n/a | 0 |")


def test_an_update_rule_ablation_is_shown_beside_its_method_not_beside_the_control(tmp_path):
    # SetGRPO's rows all sample uniformly: the control (plain GRPO) shares their policy but is not their full method.
    spec = parse_spec({"name": "rule-ablation", "seeds": [0, 1], "steps": 4, "methods": [
        {"label": "uniform", "policy": "uniform"},
        {"label": "rule", "policy": "uniform"},
        {"label": "rule-no-part", "policy": "uniform", "group": "ablation"}]})
    records, _ = run_fake_bench(spec, tmp_path)
    table2 = write_outputs(spec, records, tmp_path).read_text().split("### Table 2")[1].split("###")[0]
    assert "| rule (full) |" in table2 and "| rule-no-part |" in table2 and "uniform (full)" not in table2
