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
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error("--window: at least 1")
    columns = ["run", "test acc before -> after", "reward first -> last", "zero-variance groups", "calibrated steps", "accepted mean",
               "accepted max", "steps accepting", "recovery mean", "gateable mean", "tau_sel (last)", "coverage (last)"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for run_dir in args.runs:
        if not (run_dir / "metrics.jsonl").is_file():
            parser.error(f"{run_dir}: no metrics.jsonl (pass a simulate run directory)")
        train, summary = read_run(run_dir)
        f = gate_figures(train, args.window)
        before, after = summary.get("target_accuracy_before"), summary.get("target_accuracy_after")
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
