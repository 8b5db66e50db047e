"""Paired comparison of simulate runs laid out as DIR/<method>-seed<s>/summary.json.

    python tools/summarize_runs.py runs/quick --control uniform

Prints, per method: final target test accuracy (mean ± sd over seeds), rollouts, RO ratio
(control rollouts / method rollouts), epsilon spent, and the paired difference against the
control over matched seeds with 95% paired-t and bootstrap intervals (lab/bench/stats.py).
For a bench's own layout, `trainer-node bench --report-only` writes the full report instead.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.bench.stats import bootstrap_interval, mean_sd, paired_differences, ro_ratio, t_interval


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path)
    parser.add_argument("--control", default="uniform")
    args = parser.parse_args(argv)
    runs: dict[str, dict[int, dict]] = defaultdict(dict)
    for path in sorted(args.runs.glob("*/summary.json")):
        match = re.fullmatch(r"(.+)-seed(\d+)", path.parent.name)
        if match:
            runs[match.group(1)][int(match.group(2))] = json.loads(path.read_text())
    control = runs[args.control]
    print("| method | seeds | accuracy before | accuracy after | rollouts | RO ratio | epsilon spent "
          "| Δ vs control (pp) | 95% CI (t) | 95% CI (bootstrap) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for method, by_seed in sorted(runs.items()):
        after = [s["target_accuracy_after"] * 100 for s in by_seed.values()]
        before = [s["target_accuracy_before"] * 100 for s in by_seed.values()]
        rollouts = [s["rollouts"] for s in by_seed.values()]
        eps = [s["epsilon_spent"] for s in by_seed.values()]
        ma, sa = mean_sd(after)
        mb, _ = mean_sd(before)
        row = (f"| {method} | {len(by_seed)} | {mb:.1f} | {ma:.1f} ± {sa:.1f} | {sum(rollouts) / len(rollouts):,.0f} "
               f"| {ro_ratio([c['rollouts'] for c in control.values()], rollouts):.2f}× "
               f"| {sum(eps) / len(eps):.2f} |")
        if method == args.control:
            print(row + " (control) | — | — |")
            continue
        _, diffs = paired_differences(
            {s: v["target_accuracy_after"] * 100 for s, v in by_seed.items()},
            {s: v["target_accuracy_after"] * 100 for s, v in control.items()},
        )
        t, boot = t_interval(diffs), bootstrap_interval(diffs)
        print(row + f" {diffs.mean():+.2f} | [{t.low:+.2f}, {t.high:+.2f}] | [{boot.low:+.2f}, {boot.high:+.2f}] |")


if __name__ == "__main__":
    main()
