"""lab/bench/setgrpo_gate.py: the gate's figures over a run's calibrated steps, from metrics.jsonl."""

from __future__ import annotations

import json
import math

import pytest

from lab.bench import setgrpo_gate


def _run(tmp_path, records, summary=None):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_figures_are_taken_over_the_calibrated_steps_only(tmp_path):
    records = [{"kind": "eval", "step": 0, "accuracy": 0.5}]
    for step in range(6):
        calibrated = step >= 2
        records.append({"kind": "train", "step": step, "reward_mean": 0.1 * step, "setgrpo/calibrated": int(calibrated),
                        "zero_variance_groups": step % 2, "groups_total": 4,
                        "setgrpo/accepted_ratio": [0.9, 0.9, 0.0, 0.25, 0.0, 0.5][step],
                        "setgrpo/recovery_mean": 0.5, "setgrpo/gateable_ratio": 0.4, "setgrpo/tau_sel": 0.2,
                        "setgrpo/coverage": 0.7})
    train, summary = setgrpo_gate.read_run(_run(tmp_path, records))
    figures = setgrpo_gate.gate_figures(train, window=2)
    assert summary == {} and figures["calibrated_steps"] == 4 and figures["steps_accepting"] == 2
    assert figures["accepted_mean"] == pytest.approx(0.1875) and figures["accepted_max"] == 0.5
    assert figures["reward_first"] == pytest.approx(0.05) and figures["reward_last"] == pytest.approx(0.45)
    assert figures["zero_variance_share"] == pytest.approx(0.125)


def test_a_run_without_setgrpo_has_no_gate_figures_and_the_cli_prints_a_row(tmp_path, capsys):
    run = _run(tmp_path, [{"kind": "train", "step": 0, "reward_mean": 0.3}],
               {"target_accuracy_before": 0.4, "target_accuracy_after": 0.45})
    figures = setgrpo_gate.gate_figures(setgrpo_gate.read_run(run)[0], window=5)
    assert figures["calibrated_steps"] == 0 and math.isnan(figures["accepted_mean"])
    assert setgrpo_gate.main([str(run)]) == 0
    assert "0.400 -> 0.450" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        setgrpo_gate.main([str(tmp_path / "missing")])


def test_grader_noise_orders_the_family_levels(capsys):
    from lab.bench import grader_noise

    assert grader_noise.main(["rubric_low", "rubric_high", "--draws", "300"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| rubric")]
    low, high = (float(row.split("|")[4]) for row in rows)
    assert 0 < low < high
    with pytest.raises(SystemExit):
        grader_noise.main(["default"])  # no source grader: named, not a traceback


def test_grader_noise_tells_whether_setgrpo_sets_leave_the_origin_out():
    from lab.bench import grader_noise

    spec = {"name": "rubric_grader", "misjudge_rate": 0.05, "check_fraction": 0.85, "jitter_std": 0.02}
    spread = grader_noise.anchor_share(spec, grader_noise.GROUPS["spread"], 0.82, 60, 0.5)
    equal = grader_noise.anchor_share(spec, grader_noise.GROUPS["all equal"], 0.82, 60, 0.5)
    assert equal < spread  # a real spread of scores is what lets the set leave the origin out
    assert grader_noise.anchor_share(spec, grader_noise.GROUPS["spread"], 100.0, 20, 0.5) == 0.0  # a huge set holds it


def test_grader_noise_gate_runs_setgrpo_on_synthetic_steps(capsys):
    from lab.bench import grader_noise

    spec = {"name": "rubric_grader", "misjudge_rate": 0.05, "check_fraction": 0.85, "jitter_std": 0.02}
    options = grader_noise.profile_options("rubric_screen")
    assert options["name"] == "setgrpo" and options["reference_draws"] == 4
    wide = grader_noise.gate_run(spec, grader_noise.GATE_GROUPS["extremes"], options, steps=14)
    flat = grader_noise.gate_run(spec, grader_noise.GATE_GROUPS["all equal"], options, steps=14)
    assert wide["calibrated_steps"] > 0 and wide["accepted"] > 0.5  # a wide real spread opens the gate
    assert flat["accepted"] == 0.0  # all-equal groups: the set holds the origin, nothing certified
    assert grader_noise.main(["rubric_low", "--gate", "--patterns", "extremes", "--steps", "10", "--streams", "1",
                              "--k", "16", "--shape", "sphere", "--floor", "0.1"]) == 0
    assert "| rubric_low | extremes | 16 | sphere | 0.1 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        grader_noise.main(["rubric", "--gate", "--k", "12"])
    with pytest.raises(SystemExit):
        grader_noise.main(["rubric", "--gate", "--floor", "0"])


def _seed_run(root, label, seed, accepted, before=0.5, after=0.6):
    run = root / label / f"seed{seed}"
    run.mkdir(parents=True)
    records = [{"kind": "train", "step": step, "reward_mean": 0.5, "setgrpo/calibrated": int(step >= 1),
                "setgrpo/accepted_ratio": accepted, "setgrpo/recovery_mean": 0.5, "rollouts_step": 16,
                "time/generation": 1.0, "time/reward": 0.5, "time/update": 2.0, "setgrpo/jacobian_s": 0.25}
               for step in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps({"target_accuracy_before": before, "target_accuracy_after": after}))
    return run


def test_rows_average_over_seeds_with_the_cost_split_and_draw_figure3(tmp_path, capsys):
    runs = [_seed_run(tmp_path, "setgrpo", 0, 0.2), _seed_run(tmp_path, "setgrpo", 1, 0.4, after=0.7),
            _seed_run(tmp_path, "grpo", 0, float("nan"))]
    rows = setgrpo_gate.by_row(runs)
    assert list(rows) == ["setgrpo", "grpo"] and len(rows["setgrpo"]) == 2
    summary = setgrpo_gate.row_summary(rows["setgrpo"], window=1)
    assert summary["seeds"] == 2 and summary["accepted_mean"] == pytest.approx(0.3)
    assert summary["test_change"] == pytest.approx(0.15) and summary["step_s"] == pytest.approx(3.5)  # phase clocks only
    assert summary["setgrpo/jacobian_s"] == pytest.approx(0.25) and summary["rollouts_step"] == 16
    plot = tmp_path / "figure3.png"
    assert setgrpo_gate.main([*map(str, runs), "--rows", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert plot.stat().st_size > 0 and "| setgrpo | 2 | +15.00 |" in out and "| grpo | 1 |" in out
