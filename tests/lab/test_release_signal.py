"""lab.bench.release_signal: releases read from a run's metrics.jsonl, the per-release signal
between two clusters, and the feedback-split size at which DP noise would let it through."""

from __future__ import annotations

import json
import math

import pytest

from lab.bench import release_signal


def write_run(path, releases):
    """A run directory whose metrics log one release per entry of `releases` ({cluster: value}; keys
    starting with "feedback_" are logged as they are)."""
    path.mkdir(parents=True)
    lines = []
    for step, values in enumerate(releases):
        hypergrads = {c: v for c, v in values.items() if not c.startswith("feedback_")}
        extra = {c: v for c, v in values.items() if c.startswith("feedback_")}
        lines.append({"kind": "train", "step": 2 * step, "feedback_queries": step,
                      **{f"hypergrad/{c}": 0.5 for c in hypergrads}})  # no release yet: ignored
        lines.append({"kind": "train", "step": 2 * step + 1, "feedback_queries": step + 1,
                      **{f"hypergrad/{c}": v for c, v in hypergrads.items()}, **extra})
        lines.append({"kind": "eval", "step": 2 * step + 1})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n{partial")
    return path


def test_the_per_release_difference_and_its_spread(tmp_path):
    one = write_run(tmp_path / "s0", [{"add": 0.02, "crawl": 0.01}, {"add": 0.0, "crawl": 0.0}])
    two = write_run(tmp_path / "s1", [{"add": 0.03, "crawl": 0.0}])
    s = release_signal.signal([one, two], "add", "crawl")
    assert s["runs"] == 2 and s["releases"] == 3 and s["releases_per_run"] == 1.5
    assert s["mean"] == pytest.approx((0.01 + 0.0 + 0.03) / 3)
    assert s["run_mean_sd"] == pytest.approx(abs(0.005 - 0.03) / math.sqrt(2))
    assert s["exact_zero_share"] == pytest.approx(1 / 3)


def test_a_cluster_the_run_never_logged_is_named(tmp_path):
    run = write_run(tmp_path / "s0", [{"add": 0.02}])
    with pytest.raises(ValueError, match="hypergrad/crawl"):
        release_signal.signal([run], "add", "crawl")
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        release_signal.releases_of_run(tmp_path, ["add"])


def test_the_needed_feedback_size_resolves_the_signal_at_two_standard_errors():
    n = release_signal.needed_feedback_size(0.001, 8, noise_multiplier=4.0, sample_rate=0.5)
    assert 2 * math.sqrt(2) * 4.0 / (0.5 * n) / math.sqrt(8) == pytest.approx(0.001)
    assert release_signal.needed_feedback_size(0.0, 8, 4.0, 0.5) == math.inf


def test_the_cli_prints_the_signal_and_the_dp_part(tmp_path, capsys):
    run = write_run(tmp_path / "s0", [{"add": 0.02, "crawl": 0.01}, {"add": 0.01, "crawl": 0.0}])
    release_signal.main([str(run), "--pair", "add:crawl", "--feedback-size", "105", "--planned-releases", "10"])
    out = capsys.readouterr().out
    assert "+1.000 pp" in out and "2 releases" in out and "N >= " in out
    with pytest.raises(SystemExit):
        release_signal.main([str(run), "--pair", "add"])


def test_the_noise_each_release_carried_and_the_right_sign_share(tmp_path, capsys):
    run = write_run(tmp_path / "s0", [{"add": 0.02, "crawl": 0.01, "feedback_noise_std": 0.001, "feedback_clip": 0.02},
                                      {"add": 0.00, "crawl": 0.01, "feedback_noise_std": 0.001, "feedback_clip": 0.04}])
    s = release_signal.signal([run], "add", "crawl")
    assert s["right_sign_share"] == 0.5 and s["clip_median"] == pytest.approx(0.03)
    assert s["noise_sd_on_d"] == pytest.approx(math.sqrt(2) * 0.001)
    assert s["signal_to_noise_per_release"] == pytest.approx(0.0 / (math.sqrt(2) * 0.001))
    release_signal.main([str(run), "--pair", "add:crawl"])
    assert "owner-reported" in capsys.readouterr().out


def test_each_clusters_mean_release(tmp_path, capsys):
    one = write_run(tmp_path / "s0", [{"add": -0.02, "crawl": -0.04, "mul": 0.0}, {"add": 0.0, "crawl": -0.02, "mul": 0.0}])
    two = write_run(tmp_path / "s1", [{"add": 0.02, "crawl": -0.03, "mul": 0.01}])
    means = release_signal.cluster_means([one, two])
    assert means == pytest.approx({"add": 0.0, "crawl": -0.03, "mul": 0.01 / 3})
    release_signal.main([str(one), str(two), "--pair", "add:crawl", "--per-cluster"])
    assert "add +0.000 pp, crawl -3.000 pp, mul +0.333 pp" in capsys.readouterr().out


def test_a_pair_whose_names_hold_a_colon_is_given_with_a_comma(tmp_path, capsys):
    run = write_run(tmp_path / "s0", [{"count:medium": 0.02, "crawl": 0.01}])
    release_signal.main([str(run), "--pair", "count:medium,crawl"])
    assert "hypergrad/count:medium - hypergrad/crawl" in capsys.readouterr().out
