import math

import numpy as np
import pytest

from lab.bench import stats


def test_paired_t_interval_matches_the_hand_computed_case():
    # diffs 1..4: mean 2.5, sd sqrt(5/3) = 1.291, t(0.975, 3) = 3.182 -> half width 3.182 * 1.291 / 2 = 2.054
    ci = stats.t_interval([1, 2, 3, 4])
    assert ci.mean == pytest.approx(2.5)
    assert ci.high - ci.mean == pytest.approx(2.054, abs=1e-3)
    assert (ci.low, ci.high) == pytest.approx((0.446, 4.554), abs=1e-3)
    assert ci.n == 4 and ci.excludes_zero


def test_t_interval_edge_cases():
    assert math.isnan(stats.t_interval([]).mean)
    one = stats.t_interval([0.3])
    assert one.mean == 0.3 and math.isnan(one.low) and not one.excludes_zero
    flat = stats.t_interval([0.1, 0.1, 0.1])
    assert flat.low == pytest.approx(0.1) and flat.high == pytest.approx(0.1)
    assert not stats.t_interval([-1, 1, -1, 1]).excludes_zero


def test_paired_t_pvalue_is_the_test_the_interval_inverts():
    # diffs 1..4: t = 2.5 / (1.291 / 2) = 3.873 on 3 degrees of freedom -> two-sided p = 0.0305
    assert stats.paired_t_pvalue([1, 2, 3, 4]) == pytest.approx(0.0305, abs=1e-4)
    rng = np.random.default_rng(3)
    for _ in range(50):
        sample = rng.normal(0.4, 1.0, size=int(rng.integers(3, 13)))
        assert (stats.paired_t_pvalue(sample) < 0.05) == stats.t_interval(sample).excludes_zero
    assert math.isnan(stats.paired_t_pvalue([0.3]))
    assert stats.paired_t_pvalue([0.0, 0.0, 0.0]) == 1.0 and stats.paired_t_pvalue([0.2, 0.2]) == 0.0
    assert stats.paired_t_pvalue([0.1 + 0.2, 0.3, 0.3]) == 0.0  # equal but for rounding: no spread


def test_holm_matches_the_hand_computed_case():
    # sorted 0.01 (a), 0.03 (c), 0.04 (b), m = 3: 3 * 0.01, max(0.03, 2 * 0.03), max(0.06, 1 * 0.04)
    adjusted = stats.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": math.nan})
    assert adjusted["a"] == pytest.approx(0.03) and adjusted["c"] == pytest.approx(0.06)
    assert adjusted["b"] == pytest.approx(0.06) and math.isnan(adjusted["d"])  # NaN is outside the family
    assert stats.holm({"x": 0.6, "y": 0.9}) == {"x": 1.0, "y": 1.0}  # capped at 1, never below an earlier one
    assert stats.holm({}) == {}


def test_bootstrap_roughly_agrees_with_t_on_a_normal_sample():
    sample = np.random.default_rng(7).normal(0.5, 1.0, size=40)
    t = stats.t_interval(sample)
    boot = stats.bootstrap_interval(sample, resamples=10_000, seed=0)
    assert boot.mean == pytest.approx(t.mean)
    width = t.high - t.low
    # Same centre, similar width (percentile bootstrap is a bit narrower for small n).
    assert abs(boot.low - t.low) < 0.15 * width and abs(boot.high - t.high) < 0.15 * width
    assert boot.low <= t.mean <= boot.high


def test_bootstrap_is_seeded():
    values = np.random.default_rng(1).normal(size=9)
    same = stats.bootstrap_interval(values, resamples=500, seed=3)
    assert same == stats.bootstrap_interval(values, resamples=500, seed=3)
    assert same != stats.bootstrap_interval(values, resamples=500, seed=4)


def test_paired_differences_use_only_matched_seeds():
    seeds, diffs = stats.paired_differences({0: 0.5, 1: 0.6, 2: 0.9}, {0: 0.4, 1: 0.4, 3: 0.1})
    assert seeds == [0, 1] and diffs.tolist() == pytest.approx([0.1, 0.2])


def test_domain_balanced_average_weights_domains_equally():
    # 900 add examples at 0.9 and 100 sub at 0.1: pooled accuracy 0.82, balanced 0.5.
    assert stats.domain_balanced({"add": 0.9, "sub": 0.1}) == pytest.approx(0.5)
    assert math.isnan(stats.domain_balanced({}))


def test_ro_ratio_is_the_ratio_of_seed_means():
    assert stats.ro_ratio([7600, 7600], [3000, 3080]) == pytest.approx(7600 / 3040)
    assert stats.paired_ro_ratios({0: 100, 1: 200}, {0: 50, 1: 200}) == {0: 2.0, 1: 1.0}
    assert math.isnan(stats.ro_ratio([100], []))


def test_rollouts_to_reach_first_point_at_or_above_threshold():
    curve = [(0, 0.10), (640, 0.20), (1280, 0.35), (1920, 0.30), (2560, 0.40)]
    assert stats.rollouts_to_reach(curve, 0.35) == 1280
    assert stats.rollouts_to_reach(list(reversed(curve)), 0.25) == 1280  # order by rollouts
    assert stats.rollouts_to_reach(curve, 0.5) is None
    assert stats.rollouts_to_reach([(10, 0.1 + 0.2)], 0.3) == 10  # float rounding tolerated


def test_mean_curve_averages_both_axes_at_common_steps():
    rows = stats.mean_curve([[(0, 0, 0.1), (5, 100, 0.3), (10, 200, 0.5)], [(0, 0, 0.2), (5, 80, 0.5)]])
    assert [r["step"] for r in rows] == [0, 5]
    assert rows[1]["rollouts_mean"] == 90 and rows[1]["accuracy_mean"] == pytest.approx(0.4)
    assert (rows[1]["accuracy_min"], rows[1]["accuracy_max"]) == (0.3, 0.5)
