"""lab.bench.split_noise: the test split's share of a paired seed spread (issue 15 item 3)."""

import math

import pytest

from lab.bench import split_noise as noise


def test_error_variance_independent_is_the_stratified_binomial():
    # 100 prompts, 40 uncommon: strata (60, 40); both runs at 0.5 in each stratum.
    v = noise.error_variance((0.5, 0.5), (0.5, 0.5), 100, 40, worst=False)
    assert v == pytest.approx((0.6 ** 2 * 0.5 / 60) + (0.4 ** 2 * 0.5 / 40))


def test_worst_case_bounds_the_independent_case_and_vanishes_for_certain_outcomes():
    for a, b in (((0.5, 0.2), (0.7, 0.1)), ((0.9, 0.3), (0.8, 0.6))):
        assert noise.error_variance(a, b, 420, 163, worst=True) >= noise.error_variance(a, b, 420, 163, worst=False)
    assert noise.error_variance((1.0, 0.0), (1.0, 0.0), 420, 163, worst=True) == 0.0


def test_stratum_accuracies_recover_the_common_stratum():
    common, uncommon = noise.stratum_accuracies({"accuracy": 0.5, "uncommon_after": 0.25}, 100, 40)
    assert uncommon == 0.25 and common == pytest.approx((50 - 10) / 60)


def _testbed(diffs):
    def run(acc):
        return {"accuracy": acc, "balanced": acc, "uncommon_after": 0.3, "start": "s"}
    return {"methods": {"a": {"per_seed": {str(s): run(0.5 + d) for s, d in enumerate(diffs)}},
                        "b": {"per_seed": {str(s): run(0.5) for s in range(len(diffs))}}}}


def test_noise_row_floor_is_what_is_left_of_the_observed_variance():
    row = noise.noise_row(_testbed([0.02, -0.01, 0.05, 0.0, 0.03]), "a", "b", 420, 163)
    variance = row["sd"] ** 2
    for name in ("independent", "worst"):
        part = row[name]
        assert part["share"] == pytest.approx(part["sd_error"] ** 2 / variance)
        assert part["sd_floor"] == pytest.approx(math.sqrt(max(variance - part["sd_error"] ** 2, 0.0)))
        assert part["sd_floor"] <= part["sd_at_2x"] <= row["sd"]


def test_runs_without_uncommon_accuracy_are_refused_by_name():
    tb = _testbed([0.01, 0.02, 0.03])
    for run in tb["methods"]["a"]["per_seed"].values():
        run["uncommon_after"] = None
    with pytest.raises(SystemExit, match="a − b: fewer than 2 paired seeds"):
        noise.noise_row(tb, "a", "b", 420, 163)
