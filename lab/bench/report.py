"""results.json -> report.md: tables shaped like the paper's Table 1 and Table 2, the lambda
sweep, rollouts-to-reach, per-seed values and failures. Renders only; every number comes from
the results dict (see results.py), which is computed from the run records.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

DEFINITIONS = """\
Definitions. Accuracies are target *test* accuracy of the final checkpoint, measured by the
owner process, in % (mean ± sd over seeds, sd with ddof = 1). **Bal. avg** is the
domain-balanced average: the mean over target domains of per-domain accuracy; it is the
headline metric. **# Rollouts** is the mean over seeds of cumulative source rollouts.
**RO ratio** = mean control rollouts / mean method rollouts (> 1: fewer rollouts than the
control; the paper's "DAPO count / method count" with the control in DAPO's place).
**Δ** is the mean over matched seeds of (method - control) balanced accuracy, in percentage
points; seed s is the same initial policy and source order for every method, so the
differences are paired. **95% CI (t)**: paired t interval; **95% CI (boot)**: percentile
bootstrap of the mean difference (seeded, {resamples} resamples; with 3 seeds it has only 10
distinct values). **CI excludes 0** is "yes" only when both intervals exclude 0.
"""


def pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.{digits}f}"


def pct_pm(stat: dict[str, Any]) -> str:
    if not stat or stat.get("mean") is None:
        return "n/a"
    return f"{pct(stat['mean'])} ± {pct(stat['sd'])}"


def signed_pp(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:+.2f}"


def interval(ci: dict[str, Any] | None) -> str:
    if not ci or ci.get("low") is None or ci.get("high") is None:
        return "n/a"
    return f"[{signed_pp(ci['low'])}, {signed_pp(ci['high'])}]"


def count(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:,.0f}"


def ratio(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.2f}×"


def _table_header(domains: list[str], control: str) -> list[str]:
    columns = ["Method", *domains, "Bal. avg", "Acc.", "# Rollouts", "RO ratio", f"Δ vs {control} (pp)",
               "95% CI (t)", "95% CI (boot)", "CI excludes 0", "Seeds"]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _table_row(entry: dict[str, Any], domains: list[str], control: str, name: str | None = None) -> str:
    delta = entry.get("delta_vs_control")
    if entry["label"] == control:
        delta_cells = ["(control)", "—", "—", "—"]
    elif delta is None or not delta["seeds"]:
        delta_cells = ["n/a", "n/a", "n/a", "n/a"]
    else:
        delta_cells = [signed_pp(delta["mean"]), interval(delta["t"]), interval(delta["bootstrap"]),
                       "yes" if delta["excludes_zero"] else "no"]
    cells = [name or entry["label"], *(pct_pm(entry["domains"].get(d, {})) for d in domains),
             pct_pm(entry["balanced"]), pct_pm(entry["accuracy"]), count(entry["rollouts"]["mean"]),
             ratio(entry["ro_ratio"]), *delta_cells, str(len(entry["seeds_ok"]))]
    return "| " + " | ".join(cells) + " |"


def _methods(tb: dict[str, Any], group: str) -> list[dict[str, Any]]:
    return [m for m in tb["methods"].values() if m["group"] == group]


def _testbed_section(key: str, tb: dict[str, Any], control: str, figures: dict[str, str]) -> list[str]:
    domains = tb["domains"]
    lines = [f"## Testbed `{tb['testbed']}`", ""]
    initial = tb["initial_balanced"]
    if initial["mean"] is not None:
        lines += [(f"Initial checkpoint (before GRPO): {pct_pm(initial)}% balanced accuracy "
                   f"(over {initial['n']} runs; every method starts from the same cached tiny policy)."), ""]
    lines += [f"### Table 1: methods vs {control}", "", *_table_header(domains, control)]
    lines += [_table_row(m, domains, control) for m in _methods(tb, "main")]
    ablations = _methods(tb, "ablation")
    if ablations:
        ablated = {m["policy"] for m in ablations}  # the full method of an ablation runs the same policy
        full = [m for m in _methods(tb, "main") if m["policy"] in ablated]
        lines += ["", "### Table 2: L2RR ablations", "", *_table_header(domains, control)]
        lines += [_table_row(m, domains, control, f"{m['label']} (full)") for m in full]
        lines += [_table_row(m, domains, control) for m in ablations]
    diagnostics = _methods(tb, "diagnostic")
    if diagnostics:
        lines += ["", "### Diagnostics and variants", "",
                  ("Simulation-only references (oracle mix, target-mix) and variants (hypergradient "
                   "estimator, checkpoint selection by target feedback); not deployable rows of Table 1."), "",
                  *_table_header(domains, control)]
        lines += [_table_row(m, domains, control) for m in diagnostics]
    sweep = sorted((m for m in tb["methods"].values() if m["sweep_point"] and m["lambda"] is not None),
                   key=lambda m: m["lambda"])
    if any(m["group"] == "sweep" for m in sweep):
        lines += ["", "### Waste weight λ sweep (Figure 2)", "",
                  "| λ | Method | Bal. avg | 95% CI of the mean | # Rollouts | Δ vs control (pp) | Seeds |",
                  "|---|---|---|---|---|---|---|"]
        for m in sweep:
            ci = m["balanced_ci"]
            ci_text = "n/a" if ci.get("low") is None else f"[{pct(ci['low'])}, {pct(ci['high'])}]"
            delta = m.get("delta_vs_control")
            lines.append(f"| {m['lambda']:g} | {m['label']} | {pct_pm(m['balanced'])} | {ci_text} | "
                         f"{count(m['rollouts']['mean'])} | {signed_pp(delta['mean']) if delta else '(control)'} | "
                         f"{len(m['seeds_ok'])} |")
    lines += ["", f"### Rollouts to reach {control}'s final accuracy", ""]
    threshold = tb["control_final_balanced"]
    if threshold is not None and initial["mean"] is not None and initial["mean"] >= threshold:
        lines += [(f"Note: the initial checkpoint already meets this threshold ({pct(initial['mean'])}% >= "
                   f"{pct(threshold)}%): {control} ended below where it started, so 0 rollouts is the honest "
                   "answer and this table says nothing about efficiency here."), ""]
    lines += [(f"Threshold: {pct(threshold)}% (mean final balanced accuracy of {control}). "
               "\"Mean curve\": first point of the seed-mean accuracy-vs-rollouts curve at or above it. "
               f"\"Per seed\": first point of seed s at or above {control}'s final accuracy on seed s (paired)."), "",
              "| Method | Mean curve | Seeds reaching | Per seed |", "|---|---|---|---|"]
    for m in tb["methods"].values():
        reach = m["reach_control"]
        per_seed = ", ".join(f"s{s}: {count(v) if v is not None else 'not reached'}" for s, v in reach["per_seed"].items())
        mean = count(reach["mean_curve"]) if reach["mean_curve"] is not None else "not reached"
        lines.append(f"| {m['label']} | {mean} | {reach['seeds_reached']}/{reach['seeds']} | {per_seed or 'n/a'} |")
    lines += ["", f"### Per-seed values ({', '.join(domains) or 'no domains'})", "",
              "| Method | Seed | Bal. avg | Acc. | " + " | ".join(domains) + (" | " if domains else "")
              + "# Rollouts | Bal. avg before | ε spent / budget |",
              "|" + "---|" * (7 + len(domains))]
    for m in tb["methods"].values():
        for seed, v in m["per_seed"].items():
            eps, budget = v.get("epsilon_spent"), v.get("epsilon_budget")
            eps_text = "n/a" if eps is None else f"{eps:.3f}" + (f" / {budget:g}" if budget else " (DP off)")
            lines.append(
                f"| {m['label']} | {seed} | {pct(v['balanced'])} | {pct(v['accuracy'])} | "
                + "".join(f"{pct(v['domains'].get(d))} | " for d in domains)
                + f"{count(v['rollouts'])} | {pct(v['balanced_before'])} | "
                + eps_text + " |")
    if figures:
        lines += ["", "### Figures", ""]
        lines += [f"![{title}]({path})" for title, path in figures.items()]
    return lines


def render_report(results: dict[str, Any], figures: dict[str, dict[str, str]] | None = None) -> str:
    """The whole report.md text. `figures` maps testbed key -> {title: relative PNG path}."""
    spec = results["spec"]
    control = results["control"]
    counts = ", ".join(f"{n} {status}" for status, n in results["run_counts"].items())
    lines = [
        f"# Bench report: {spec['name']}", "",
        (f"- seeds: {', '.join(str(s) for s in spec['seeds'])} (matched across methods); steps: {spec['steps']}; "
         f"testbeds: {', '.join(spec['testbeds'])}"),
        f"- control: {control}; DP: {'off (--no-dp)' if spec['no_dp'] else 'on'}; runs: {counts}",
        f"- git commit(s): {', '.join(results['git_commits'])}; generated {results['generated_at']}",
        "", DEFINITIONS.format(resamples=spec["bootstrap_resamples"]),
    ]
    for key, tb in results["testbeds"].items():
        lines += _testbed_section(key, tb, control, (figures or {}).get(key, {}))
        lines.append("")
    bad = [r for r in results["runs"] if r.get("status") != "ok"]
    if bad:
        lines += ["## Runs without results", "", "| Run | Status | Why |", "|---|---|---|"]
        for r in bad:
            why = (r.get("error") or "").splitlines()[0] if r.get("error") else ""
            lines.append(f"| {r['id']} | {r.get('status', 'missing')} | {why.replace('|', '/')} |")
        lines += ["", "Failed runs keep their log in RUN_DIR/bench.log; their record has the last lines."]
    return "\n".join(lines).rstrip() + "\n"


def write_report(results: dict[str, Any], out: Path, figures: dict[str, dict[str, str]] | None = None) -> Path:
    path = Path(out) / "report.md"
    path.write_text(render_report(results, figures))
    return path
