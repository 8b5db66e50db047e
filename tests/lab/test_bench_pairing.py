"""The bench pairs runs only from the same starting checkpoint, and reports answer base rates."""

import copy

import pytest

from lab.bench.report import render_report
from lab.bench.results import compute_results, same_start
from lab.bench.spec import parse_spec
from tests.lab.test_bench_runner import run_fake_bench

SPEC = {"name": "pairing-test", "seeds": [0, 1, 2], "steps": 4,
        "methods": [{"label": "uniform", "policy": "uniform"}, {"label": "l2rr", "policy": "l2rr"}]}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    spec = parse_spec(SPEC)
    records, _ = run_fake_bench(spec, out)
    return spec, records, out


def _with_starts(records, starts, uncommon=None):
    """Records whose summaries carry a starting digest (and uncommon-answer accuracy) per (label, seed)."""
    records = copy.deepcopy(records)
    for record in records:
        key = (record["label"], record["seed"])
        record["summary"]["initial_checkpoint_sha256"] = starts.get(key, "a" * 64)
        if uncommon is not None:
            record["summary"]["base_rates"] = {"commonest_answer_accuracy": 0.612}
            record["summary"]["target_accuracy_uncommon_after"] = uncommon[key]
    return records


def test_runs_from_another_starting_checkpoint_are_not_paired(bench):
    spec, records, out = bench
    results = compute_results(spec, _with_starts(records, {("l2rr", 2): "b" * 64}), out)
    l2rr = results["testbeds"]["default"]["methods"]["l2rr"]
    assert l2rr["delta_vs_control"]["seeds"] == [0, 1] and l2rr["unpaired_seeds"] == [2]
    assert l2rr["seeds_ok"] == [0, 1, 2]  # the run is still reported, only not paired
    assert results["testbeds"]["default"]["starting_checkpoints"] == ["a" * 64, "b" * 64]
    assert "l2rr seeds [2]" in render_report(results)
    # the same records, one start: every seed pairs
    same = compute_results(spec, _with_starts(records, {}), out)["testbeds"]["default"]["methods"]["l2rr"]
    assert same["delta_vs_control"]["seeds"] == [0, 1, 2] and same["unpaired_seeds"] == []


def test_records_without_a_digest_pair_as_before():
    old = {0: {"start": None}, 1: {"start": None}}
    assert same_start(old, old) == ([0, 1], [])
    assert same_start({0: {"start": "x"}}, {0: {"start": None}}) == ([], [0])


def test_the_report_shows_the_base_rate_and_the_uncommon_answer_accuracy(bench):
    spec, records, out = bench
    uncommon = {(label, seed): 0.20 + 0.01 * seed + (0.05 if label == "l2rr" else 0.0)
                for label in ("uniform", "l2rr") for seed in (0, 1, 2)}
    results = compute_results(spec, _with_starts(records, {}, uncommon), out)
    tb = results["testbeds"]["default"]
    assert tb["commonest_answer_accuracy"] == 0.612
    assert tb["methods"]["l2rr"]["delta_uncommon_vs_control"]["mean"] == pytest.approx(0.05)
    assert tb["methods"]["uniform"]["uncommon"]["mean"] == pytest.approx(0.21)
    report = render_report(results)
    assert "Always giving each target domain's commonest answer scores 61.2%" in report
    assert "| l2rr | 26.0 ± 1.0 | +5.00 |" in report
