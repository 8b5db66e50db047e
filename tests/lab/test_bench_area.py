"""The bench's secondary metric: the normalised area under each run's accuracy-vs-rollouts curve,
reported next to accuracy and paired against the control like accuracy (issue 15 item 3)."""

import copy
import json

import pytest

from lab.bench import stats
from lab.bench.report import render_report
from lab.bench.results import compute_results
from lab.bench.spec import parse_spec
from tests.lab.test_bench_runner import run_fake_bench

SPEC = {"name": "area-test", "seeds": [0, 1, 2], "steps": 4, "config": {"run": {"eval_every": 2}},
        "methods": [{"label": "uniform", "policy": "uniform"}, {"label": "l2rr", "policy": "l2rr"}]}


def test_a_known_curve_has_its_mean_accuracy_over_the_rollouts():
    # 0.4 -> 0.6 over the first 100 rollouts (area 50), flat 0.6 over the next 300 (area 180): 230 / 400
    assert stats.normalised_area([(0, 0.4), (100, 0.6), (400, 0.6)]) == pytest.approx(0.575)
    # order of the points does not matter; a straight line's area is its midpoint
    assert stats.normalised_area([(400, 0.6), (0, 0.4), (100, 0.6)]) == pytest.approx(0.575)
    assert stats.normalised_area([(1000, 0.2), (3000, 0.8)]) == pytest.approx(0.5)
    # uneven spacing weights each segment by the rollouts it spans, not by its step count
    assert stats.normalised_area([(0, 0.0), (10, 1.0), (100, 1.0)]) == pytest.approx((5 + 90) / 100)


def test_no_area_from_one_evaluation_or_a_zero_rollout_span():
    assert stats.normalised_area([(0, 0.5)]) is None
    assert stats.normalised_area([]) is None
    assert stats.normalised_area([(0, 0.5), (0, 0.7)]) is None


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    spec = parse_spec(SPEC)
    records, _ = run_fake_bench(spec, out)
    return spec, records, out


def _write_curve(out, label, seed, points):
    """Replace a run's eval records by hand-made (step, rollouts, accuracy) ones."""
    path = out / "runs" / "default" / label / f"seed{seed}" / "metrics.jsonl"
    kept = [line for line in path.read_text().splitlines() if json.loads(line).get("kind") != "eval"]
    evals = [json.dumps({"kind": "eval", "name": "target_test", "step": step, "rollouts_cumulative": rollouts,
                         "accuracy": accuracy, "accuracy/count": accuracy}) for step, rollouts, accuracy in points]
    path.write_text("\n".join(kept + evals) + "\n")


def test_areas_are_paired_on_shared_seeds_and_starts_and_reported(bench):
    spec, records, out = bench
    for seed in (0, 1, 2):  # the control rises 0.4 -> 0.5 -> 0.6; l2rr reaches 0.6 at the midpoint
        _write_curve(out, "uniform", seed, [(0, 0, 0.4), (2, 100, 0.5 + 0.01 * seed), (4, 200, 0.6)])
        _write_curve(out, "l2rr", seed, [(0, 0, 0.4), (2, 100, 0.6 + 0.02 * seed), (4, 200, 0.6)])
    records = copy.deepcopy(records)
    for record in records:  # seed 2 of l2rr started from another checkpoint: not paired
        other = record["label"] == "l2rr" and record["seed"] == 2
        record["summary"]["initial_checkpoint_sha256"] = ("b" if other else "a") * 64
    results = compute_results(spec, records, out)
    methods = results["testbeds"]["default"]["methods"]
    uniform, l2rr = methods["uniform"], methods["l2rr"]
    # area = (a0 / 2 + a_mid + a_end / 2) / 2 on two equal segments
    assert uniform["per_seed"]["1"]["area"] == pytest.approx((0.2 + 0.51 + 0.3) / 2)
    assert uniform["area"]["n"] == 3 and uniform["area"]["mean"] == pytest.approx((0.2 + 0.51 + 0.3) / 2)
    delta = l2rr["delta_area_vs_control"]
    assert delta["seeds"] == [0, 1]  # like accuracy: the shared start only
    assert delta["diffs"] == pytest.approx([0.05, 0.055])  # (0.1 + 0.01 * s) / 2
    assert delta["mean"] == pytest.approx(0.0525) and delta["sd"] == pytest.approx(0.005 / 2 ** 0.5)
    assert delta["t"]["low"] < 0.0525 < delta["t"]["high"]
    assert l2rr["delta_vs_control"]["seeds"] == [0, 1] and l2rr["seeds_without_area"] == []
    report = render_report(results)
    assert "### Secondary metric: area under the accuracy-vs-rollouts curve" in report
    row = next(line for line in report.splitlines() if line.startswith("| l2rr |") and "/3 |" in line)
    assert "+5.25 | 0.35 |" in row and row.endswith("| 3/3 |")


def test_a_run_with_one_evaluation_has_no_area_and_the_report_says_so(bench):
    spec, records, out = bench
    for seed in (0, 1, 2):
        _write_curve(out, "uniform", seed, [(0, 0, 0.4), (4, 200, 0.6)])
        _write_curve(out, "l2rr", seed, [(0, 0, 0.4), (4, 200, 0.7)])
    _write_curve(out, "l2rr", 1, [(4, 200, 0.7)])  # only the final evaluation
    results = compute_results(spec, records, out)
    l2rr = results["testbeds"]["default"]["methods"]["l2rr"]
    assert l2rr["per_seed"]["1"]["area"] is None and l2rr["seeds_without_area"] == [1]
    assert l2rr["area"]["n"] == 2 and l2rr["delta_area_vs_control"]["seeds"] == [0, 2]
    assert l2rr["delta_vs_control"]["seeds"] == [0, 1, 2]  # accuracy still pairs every seed
    report = render_report(results)
    assert "No area (fewer than 2 target-test evaluations): l2rr seeds [1]" in report


def _results(curves):
    """A results.json-like dict: per method, per seed (step, rollouts, accuracy) evaluations."""
    return {"testbeds": {"tb": {"methods": {label: {
        "per_seed": {str(s): {"balanced": c[-1][2], "start": "a" * 64} for s, c in seeds.items()},
        "per_seed_curves": {str(s): [list(p) for p in c] for s, c in seeds.items()}}
        for label, seeds in curves.items()}}}}


def test_metric_noise_pairs_each_metric_and_leaves_out_the_shared_start_and_the_final_step():
    from lab.bench.metric_noise import noise_rows, paired_seeds, table

    results = _results({
        "uniform": {s: [(0, 0, 0.4), (2, 100, 0.5), (4, 200, 0.6)] for s in range(3)},
        # +0.1 at the midpoint on every seed, +0.00 / +0.02 / +0.04 at the end
        "oracle": {s: [(0, 0, 0.4), (2, 100, 0.6), (4, 200, 0.6 + 0.02 * s)] for s in range(3)},
    })
    tb = results["testbeds"]["tb"]
    assert paired_seeds(tb, "oracle", "uniform") == [0, 1, 2]
    rows = {r["metric"]: r for r in noise_rows(tb, "oracle", "uniform", [0, 1, 2])}
    assert rows["final"]["mean"] == pytest.approx(0.02) and rows["final"]["sd"] == pytest.approx(0.02)
    assert rows["step2"]["sd"] == pytest.approx(0.0) and rows["step2"]["mean"] == pytest.approx(0.1)
    # area difference = d_mid / 2 + d_end / 4 on two equal segments from a shared start
    assert rows["area"]["diffs"] == pytest.approx([0.05, 0.055, 0.06])
    assert rows["area"]["snr"] == pytest.approx(0.055 / 0.005)
    lines = table(results, ["oracle:uniform"])
    assert [line.split(" | ")[1] for line in lines[3:]] == ["final", "step2", "area"]  # no step0, no step4
    with pytest.raises(SystemExit, match="no method 'dapo'"):
        table(results, ["dapo:uniform"])


def test_the_snr_gain_interval_is_zero_for_a_rescaled_metric_and_positive_for_a_quieter_one():
    from lab.bench.metric_noise import snr_gain_interval

    seeds = list(range(12))
    noisy = [0.02 + (0.04 if s % 2 else -0.04) for s in seeds]
    final = {"seeds": seeds, "diffs": noisy}
    half = {"seeds": seeds, "diffs": [d / 2 for d in noisy]}  # 2 evaluations: d_area = d_final / 2
    assert snr_gain_interval(half, final) == pytest.approx((0.0, 0.0), abs=1e-9)
    quiet = {"seeds": seeds, "diffs": [0.02 + (0.01 if s % 2 else -0.01) for s in seeds]}
    low, high = snr_gain_interval(quiet, final)
    assert 0 < low < high


def test_the_snr_gain_is_signed_by_the_direction_of_the_effect():
    from lab.bench.metric_noise import snr_gain_interval

    seeds = list(range(12))
    final = {"seeds": seeds, "diffs": [-0.02 + (0.04 if s % 2 else -0.04) for s in seeds]}  # a loss, noisy
    quiet = {"seeds": seeds, "diffs": [-0.02 + (0.01 if s % 2 else -0.01) for s in seeds]}
    assert snr_gain_interval(quiet, final)[0] > 0  # further from 0 on the side of the loss: a gain
