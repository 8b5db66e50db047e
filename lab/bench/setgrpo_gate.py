"""What SetGRPO's gate did in a run, and whether the training reward moved (prints a table; not a test).

    python -m lab.bench.setgrpo_gate RUN_DIR [RUN_DIR ...]

RUN_DIRs are `trainer-node simulate` run directories (a bench's OUT/runs/<testbed>/<label>/seed*).
Per run, from metrics.jsonl and summary.json: the target test accuracy before -> after (the owner's
exact grader), the training reward (the grader's first draw: noisy for a noisy row) over the first
and the last `--window` steps, and, for SetGRPO runs, over the calibrated steps (`setgrpo/calibrated`
= 1): the mean and largest accepted-group ratio (`setgrpo/accepted_ratio`: accepted / non-degenerate
training groups), the steps that accepted any group, the mean recovery ratio eta* (`recovery_mean`),
the share of training groups with a finite gate statistic (`gateable_ratio`), the last selected
threshold and the running coverage of the set (docs/SETGRPO.md, "Diagnostics"). The seed's Figure 3
is these figures over training; `--steps` prints them per step.

    python -m lab.bench.setgrpo_gate OUT/runs/<testbed>/*/seed* --rows [--plot figure3.png]

`--rows` groups the runs by row (the run directory's parent: the bench label) and prints, per row,
the mean over its seeds of the figures above, then the seed's cost table (Table 6): seconds per
training step, split into generation, grading (`time/reward`), the update and, inside it, SetGRPO's
geometry pass (`setgrpo/jacobian_s`) and its calibration, recovery and gating (`setgrpo/recovery_s`),
and the rollouts per step (held-back groups are generated and graded, so they count). `--plot`
draws Figure 3: the accepted-group ratio and the recovery ratio per step, mean over seeds with a
min-max band, one line per SetGRPO row.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def read_run(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(train records in step order, summary.json or {})."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = sorted((r for r in records if r.get("kind") == "train"), key=lambda r: r["step"])
    summary_path = run_dir / "summary.json"
    return train, (json.loads(summary_path.read_text()) if summary_path.is_file() else {})


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def gate_figures(train: list[dict[str, Any]], window: int) -> dict[str, Any]:
    """The figures of one run (SetGRPO's are NaN / 0 for a run without it)."""
    rewards = [r.get("reward_mean", float("nan")) for r in train]
    calibrated = [r for r in train if r.get("setgrpo/calibrated") == 1]
    accepted = [r.get("setgrpo/accepted_ratio", float("nan")) for r in calibrated]
    last = calibrated[-1] if calibrated else {}
    return {
        "steps": len(train),
        "reward_first": _mean(rewards[:window]),
        "reward_last": _mean(rewards[-window:]),
        "zero_variance_share": _mean([r["zero_variance_groups"] / r["groups_total"] for r in train
                                      if r.get("groups_total")]),
        "calibrated_steps": len(calibrated),
        "accepted_mean": _mean(accepted),
        "accepted_max": max((a for a in accepted if math.isfinite(a)), default=float("nan")),
        "steps_accepting": sum(1 for a in accepted if math.isfinite(a) and a > 0),
        "recovery_mean": _mean([r.get("setgrpo/recovery_mean", float("nan")) for r in calibrated]),
        "gateable_mean": _mean([r.get("setgrpo/gateable_ratio", float("nan")) for r in calibrated]),
        "tau_sel_last": last.get("setgrpo/tau_sel", float("nan")),
        "coverage_last": last.get("setgrpo/coverage", float("nan")),
    }


COST_PHASES = ("time/generation", "time/reward", "time/update", "setgrpo/jacobian_s", "setgrpo/recovery_s")


def step_seconds(record: dict[str, Any]) -> float:
    """A training step's wall time: the sum of its phase clocks (SetGRPO's split is inside `update`)."""
    return sum(v for k, v in record.items() if k.startswith("time/") and isinstance(v, (int, float)))


def cost_figures(train: list[dict[str, Any]]) -> dict[str, float]:
    """Mean per training step: total seconds, each of COST_PHASES, and rollouts generated."""
    figures = {"step_s": _mean([step_seconds(r) for r in train]),
               "rollouts_step": _mean([r.get("rollouts_step", float("nan")) for r in train])}
    for key in COST_PHASES:
        figures[key] = _mean([r.get(key, float("nan")) for r in train])
    return figures


def per_step(train: list[dict[str, Any]], key: str) -> dict[int, float]:
    """step -> value of `key` on the calibrated steps (Figure 3's points)."""
    return {r["step"]: r[key] for r in train if r.get("setgrpo/calibrated") == 1
            and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])}


def by_row(run_dirs: Sequence[Path]) -> dict[str, list[Path]]:
    """Run directories grouped by row label (OUT/runs/<testbed>/<label>/seed<k>), in first-seen order."""
    rows: dict[str, list[Path]] = {}
    for run_dir in run_dirs:
        rows.setdefault(run_dir.parent.name, []).append(run_dir)
    return rows


def test_scores(summary: dict[str, Any]) -> tuple[float | None, float | None]:
    """(target test accuracy before, after) from summary.json; None where the run did not record it."""
    return summary.get("target_accuracy_before"), summary.get("target_accuracy_after")


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


def row_summary(runs: Sequence[Path], window: int) -> dict[str, Any]:
    """The mean over a row's seeds of gate_figures, cost_figures and the test score change."""
    figures = []
    for run_dir in runs:
        train, summary = read_run(run_dir)
        before, after = test_scores(summary)
        change = after - before if before is not None and after is not None else float("nan")
        figures.append({**gate_figures(train, window), **cost_figures(train), "test_change": change})
    keys = [k for k, v in figures[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {"seeds": len(figures), **{k: _mean([f[k] for f in figures]) for k in keys}}


def plot_figure3(rows: dict[str, list[Path]], path: Path) -> Path | None:
    """Accepted-group and recovery ratio per calibrated step, mean over seeds with a min-max band."""
    curves = {}
    for label, runs in rows.items():
        trains = [read_run(run_dir)[0] for run_dir in runs]
        series = {key: [per_step(train, key) for train in trains]
                  for key in ("setgrpo/accepted_ratio", "setgrpo/recovery_mean")}
        if any(series["setgrpo/accepted_ratio"]):
            curves[label] = series
    if not curves:
        return None
    from lab.bench.plots import _plt, _save

    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in zip(axes, ("setgrpo/accepted_ratio", "setgrpo/recovery_mean"),
                              ("accepted-group ratio", "recovery ratio eta* (mean over the step's training groups)")):
        for label, series in curves.items():
            steps = sorted({s for seed in series[key] for s in seed})
            values = [[seed[s] for seed in series[key] if s in seed] for s in steps]
            ax.plot(steps, [sum(v) / len(v) for v in values], marker=".", label=f"{label} ({len(series[key])} seeds)")
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.08)
        ax.set_xlabel("training step (calibrated steps only)")
        ax.set_title(title)
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize="small")
    return _save(fig, path)


def print_rows(rows: dict[str, list[Path]], window: int) -> None:
    summaries = {label: row_summary(runs, window) for label, runs in rows.items()}
    print_table(["row", "seeds", "test score change (pp)", "zero-variance groups", "calibrated steps", "accepted mean",
                 "steps accepting", "recovery mean", "gateable mean", "coverage (last)"],
                [[label, str(f["seeds"]), f"{100 * f['test_change']:+.2f}",
                  *(_fmt(f[k]) for k in ("zero_variance_share", "calibrated_steps", "accepted_mean", "steps_accepting",
                                         "recovery_mean", "gateable_mean", "coverage_last"))]
                 for label, f in summaries.items()])
    print()
    print_table(["row", "s / step", "generation", "grading", "update", "  geometry", "  recovery + gate", "rollouts / step"],
                [[label, *(_fmt(f[k]) for k in ("step_s", *COST_PHASES)), _fmt(f["rollouts_step"])]
                 for label, f in summaries.items()])


def _fmt(value: Any) -> str:
    if value is None:  # a threshold the gate never certified is logged as null
        return "none"
    if isinstance(value, float):
        return "—" if not math.isfinite(value) else f"{value:.3f}"
    return str(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.setgrpo_gate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR")
    parser.add_argument("--window", type=int, default=5, help="steps averaged at each end for the reward (default 5)")
    parser.add_argument("--steps", action="store_true", help="also print SetGRPO's figures per calibrated step")
    parser.add_argument("--rows", action="store_true",
                        help="one line per row (the run directory's parent), mean over its seeds, and the cost table")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="draw Figure 3 (accepted and recovery ratio per step) here")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error("--window: at least 1")
    for run_dir in args.runs:
        if not (run_dir / "metrics.jsonl").is_file():
            parser.error(f"{run_dir}: no metrics.jsonl (pass a simulate run directory)")
    if args.plot is not None:
        drawn = plot_figure3(by_row(args.runs), args.plot)
        print(f"Figure 3: {drawn}" if drawn else "--plot: no SetGRPO run among RUN_DIRs, nothing drawn")
    if args.rows:
        print_rows(by_row(args.runs), args.window)
        return 0
    columns = ["run", "test acc before -> after", "reward first -> last", "zero-variance groups", "calibrated steps", "accepted mean",
               "accepted max", "steps accepting", "recovery mean", "gateable mean", "tau_sel (last)", "coverage (last)"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for run_dir in args.runs:
        train, summary = read_run(run_dir)
        f = gate_figures(train, args.window)
        before, after = test_scores(summary)
        accuracy = f"{before:.3f} -> {after:.3f}" if before is not None and after is not None else "—"
        cells = [str(run_dir), accuracy, f"{_fmt(f['reward_first'])} -> {_fmt(f['reward_last'])}",
                 *(_fmt(f[k]) for k in ("zero_variance_share", "calibrated_steps", "accepted_mean", "accepted_max", "steps_accepting",
                                        "recovery_mean", "gateable_mean", "tau_sel_last", "coverage_last"))]
        print("| " + " | ".join(cells) + " |")
        if args.steps:
            for r in train:
                if r.get("setgrpo/calibrated") == 1:
                    print(f"    step {r['step']:3d}  accepted {_fmt(r.get('setgrpo/accepted_ratio', float('nan')))}"
                          f"  recovery {_fmt(r.get('setgrpo/recovery_mean', float('nan')))}"
                          f"  gateable {_fmt(r.get('setgrpo/gateable_ratio', float('nan')))}"
                          f"  tau_sel {_fmt(r.get('setgrpo/tau_sel', float('nan')))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
