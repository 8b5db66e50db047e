"""Which published comparisons survive a multiplicity adjustment? (prints numbers; not a test)

    python tools/holm_published.py docs/results/full.json [more results.json ...] [--alpha 0.05]

For each testbed of each bench results.json: every method's paired differences with the
control (the per-seed `diffs` the file keeps), the paired t test's two-sided p-value, and that
p Holm-adjusted over all of the file's comparisons with its control: the same function, and so
the same numbers, as a fresh `trainer-node bench --report-only` prints in its "p (Holm)" column.

Why it is here: files published before that column existed cannot always be re-reported, as
`--restore` refuses records whose profile has changed since; their per-seed differences are
still in the file. An unadjusted interval that excludes 0 is one comparison among many: at 95%,
one in twenty does so by chance alone.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from lab.bench.results import adjust_for_multiplicity


def adjusted_rows(results: dict) -> list[dict]:
    """One row per (testbed, method) with a comparison to the control, smallest raw p first."""
    rows = []
    for key, testbed in results["testbeds"].items():
        adjust_for_multiplicity(testbed["methods"])  # what the bench report does, from the kept diffs
        deltas = {label: m["delta_vs_control"] for label, m in testbed["methods"].items()
                  if m.get("delta_vs_control") and m["delta_vs_control"]["seeds"]}
        for label, d in sorted(deltas.items(), key=lambda item: _or_nan(item[1]["p_t"])):
            rows.append({"testbed": key, "method": label, "control": results["control"], "mean": d["mean"],
                         "low": d["t"]["low"], "high": d["t"]["high"], "n": len(d["diffs"]),
                         "p": _or_nan(d["p_t"]), "p_holm": _or_nan(d["p_holm"]), "family_size": d["holm_family_size"]})
    return rows


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value  # None: a comparison over fewer than 2 seeds


def _pp(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.2f}"  # None: an interval over fewer than 2 seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="bench results.json files (docs/results/*.json)")
    parser.add_argument("--alpha", type=float, default=0.05, help="the level a claim is read at (default 0.05)")
    args = parser.parse_args(argv)
    print("| file | testbed | method | Δ vs control (pp) | 95% CI (t) | p | p (Holm) | comparisons | seeds |")
    print("|---|---|---|---|---|---|---|---|---|")
    skipped = 0
    for path in args.results:
        try:
            results = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            print(f"{path}: cannot be read as JSON ({error}); skipped", file=sys.stderr)
            skipped += 1
            continue
        if not isinstance(results, dict) or "testbeds" not in results or "control" not in results:
            print(f"{path}: not a bench results.json (it has no `testbeds` and `control` fields); skipped",
                  file=sys.stderr)
            skipped += 1
            continue
        for r in adjusted_rows(results):
            verdict = "**" if r["p_holm"] < args.alpha else ""
            print(f"| {path.name} | {r['testbed']} | {r['method']} vs {r['control']} | {_pp(r['mean'])} | "
                  f"[{_pp(r['low'])}, {_pp(r['high'])}] | {r['p']:.4f} | {verdict}{r['p_holm']:.3f}{verdict} | "
                  f"{r['family_size']} | {r['n']} |")
    return 2 if skipped == len(args.results) else 0  # a glob over docs/results also meets other files


if __name__ == "__main__":
    sys.exit(main())
