"""results.json -> report.md: tables shaped like the paper's Table 1 and Table 2, the lambda
sweep, rollouts-to-reach, per-seed values and failures; on a bench with DataFlex-RL rows, its
three-family table (selection, reweighting, mixture; mixtures also against the fixed mixture)
and its evaluation-sensitivity table (every summary, its spread, the rank correlation with the
domain-balanced summary). Renders only; every number comes from the results dict (see
results.py), which is computed from the run records.
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
**p (Holm)** is the paired t test's two-sided p-value, Holm-adjusted over all of the testbed's
comparisons with the control (and, in the family table, over those with a family control):
claiming only the rows below 0.05 keeps the chance of any false claim among them at 5%. With
many methods some unadjusted interval excludes 0 by chance (one in twenty at 95%), so a "yes"
whose p (Holm) is not below 0.05 is not evidence of a difference.
On a multi-domain testbed (target domains are benchmarks grouped into families) the domain
columns are the families' mean accuracies and **Bal. avg** is the mean over families
(DataFlex-RL's domain-balanced score); the per-benchmark table follows.
"""

FAMILY_TITLES = {"selection": "Selection (which responses enter the update)",
                 "reweighting": "Reweighting (how much each response or token counts)",
                 "mixture": "Mixture adaptation (which domains supply prompts)"}


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


def pvalue(delta: dict[str, Any] | None) -> str:
    value = (delta or {}).get("p_holm")
    if value is None or not math.isfinite(value):
        return "n/a"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def count(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:,.0f}"


def ratio(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.2f}×"


def _table_header(domains: list[str], control: str) -> list[str]:
    columns = ["Method", *domains, "Bal. avg", "Acc.", "# Rollouts", "RO ratio", f"Δ vs {control} (pp)",
               "95% CI (t)", "95% CI (boot)", "CI excludes 0", "p (Holm)", "Seeds"]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _table_row(entry: dict[str, Any], domains: list[str], control: str, name: str | None = None,
               columns: str = "domains") -> str:
    delta = entry.get("delta_vs_control")
    if entry["label"] == control:
        delta_cells = ["(control)", "—", "—", "—", "—"]
    else:
        delta_cells = _delta_cells(delta)
    cells = [name or entry["label"], *(pct_pm(entry[columns].get(d, {})) for d in domains),
             pct_pm(entry["balanced"]), pct_pm(entry["accuracy"]), count(entry["rollouts"]["mean"]),
             ratio(entry["ro_ratio"]), *delta_cells, str(len(entry["seeds_ok"]))]
    return "| " + " | ".join(cells) + " |"


def _methods(tb: dict[str, Any], group: str) -> list[dict[str, Any]]:
    return [m for m in tb["methods"].values() if m["group"] == group]


def _delta_cells(delta: dict[str, Any] | None) -> list[str]:
    if delta is None or not delta["seeds"]:
        return ["n/a", "n/a", "n/a", "n/a", "n/a"]
    return [signed_pp(delta["mean"]), interval(delta["t"]), interval(delta["bootstrap"]),
            "yes" if delta["excludes_zero"] else "no", pvalue(delta)]


def _family_section(tb: dict[str, Any], control: str) -> list[str]:
    """DataFlex-RL's three-family table: each family's rows paired against the control, and
    against the family's own control where the spec names one (mixtures: the equal mixture)."""
    rows = [m for m in tb["methods"].values() if m.get("family")]
    if not rows:
        return []
    control_entry = tb["methods"][control]
    lines = ["", f"### DataFlex-RL's three families vs {control}", "",
             (f"Paired over matched seeds, domain-balanced accuracy (pp). {control}: "
              f"{pct_pm(control_entry['balanced'])}%."), "",
             ("| Family | Method | Intervention | Bal. avg | "
              f"Δ vs {control} (pp) | 95% CI (t) | 95% CI (boot) | CI excludes 0 | p (Holm) | "
              "Δ vs family control (pp) | 95% CI (t) | p (Holm) | Seeds |"), "|" + "---|" * 13]
    for family in FAMILY_TITLES:
        for m in (r for r in rows if r["family"] == family):
            intervention = (f"selection = {_rule_name(m['selection'])}" if m.get("selection") is not None else "")
            if m.get("reweighting") is not None:
                intervention = ", ".join(x for x in (intervention, f"reweighting = {_rule_name(m['reweighting'])}") if x)
            intervention = intervention or f"policy = {m['policy']}"
            own = m.get("delta_vs_family_control")
            own_cells = ([f"{signed_pp(own['mean'])} (vs {own['control']})", interval(own["t"]), pvalue(own)]
                         if own and own["seeds"]
                         else ["(family control)" if _is_family_control(tb, m) else "—", "—", "—"])
            lines.append(f"| {FAMILY_TITLES[family].split(' (')[0]} | {m['label']} | {intervention} | "
                         f"{pct_pm(m['balanced'])} | " + " | ".join(_delta_cells(m.get("delta_vs_control")))
                         + " | " + " | ".join(own_cells) + f" | {len(m['seeds_ok'])} |")
    return lines


def _rule_name(rule: Any) -> str:
    return rule if isinstance(rule, str) else f"{rule.get('name')} {{{', '.join(f'{k}={v}' for k, v in rule.items() if k != 'name')}}}"


def _is_family_control(tb: dict[str, Any], entry: dict[str, Any]) -> bool:
    return any((m.get("delta_vs_family_control") or {}).get("control") == entry["label"] for m in tb["methods"].values())


def _sensitivity_section(tb: dict[str, Any], control: str) -> list[str]:
    """Every summary of the same runs, its spread over the main methods and its rank correlation
    with the domain-balanced summary (DataFlex-RL's Table 8)."""
    sensitivity = tb.get("evaluation_sensitivity")
    if not sensitivity or not (tb.get("grouped") or tb.get("named_summaries")):
        return []
    summaries = sensitivity["summaries"]
    names = list(summaries)
    described = {"domain_balanced": "mean over families of the mean over their benchmarks (headline)",
                 "macro": "mean over all benchmarks, equal weight"}
    for name, members in tb.get("named_summaries", {}).items():
        described[name] = "mean over " + ", ".join(members)
    lines = ["", "### Evaluation summaries of the same runs, and their rank agreement", "",
             (f"Over the {len(sensitivity['methods'])} main methods with results on every seed "
              f"({', '.join(str(s) for s in sensitivity.get('seeds', []))})"
              + (f"; left out, with fewer seeds: {', '.join(sensitivity['left_out'])}"
                 if sensitivity.get("left_out") else "")
              + ". **ρ** is Spearman's rank "
              "correlation of the methods' mean scores under a summary with their domain-balanced scores; "
              "**spread** is the best minus the worst method mean (pp)."), "",
             "| Summary | Definition | ρ vs domain-balanced | Spread (pp) | Best method |", "|---|---|---|---|---|"]
    for name in names:
        item = summaries[name]
        rho = "n/a" if item["rho_vs_domain_balanced"] is None else f"{item['rho_vs_domain_balanced']:+.2f}"
        spread = "n/a" if item["spread"] is None else f"{100 * item['spread']:.2f}"
        lines.append(f"| {name} | {described.get(name, '')} | {rho} (n = {item['n_methods']}) | {spread} | "
                     f"{item['best'] or 'n/a'} |")
    header = ["Method", *names]
    lines += ["", f"Scores per summary (mean over seeds, %) and Δ vs {control} (pp, paired t interval):", "",
              "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label in sensitivity["methods"]:
        m = tb["methods"][label]
        cells = [label]
        for name in names:
            delta = (m.get("summary_deltas") or {}).get(name)
            text = pct(m["summaries"][name]["mean"])
            if delta and delta["seeds"]:
                text += f" ({signed_pp(delta['mean'])} {interval(delta['t'])})"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _by_family(tb: dict[str, Any]) -> list[str]:
    """The testbed's benchmarks, grouped by family (a benchmark without one is its own)."""
    families = tb.get("benchmark_families") or {}
    return sorted(tb["domains"], key=lambda d: (families.get(d, d), d))


def _benchmark_section(tb: dict[str, Any], control: str) -> list[str]:
    if not tb.get("grouped"):
        return []
    families = tb["benchmark_families"]
    domains = _by_family(tb)
    header = ["Method", *(f"{d} ({families.get(d, d)})" for d in domains)]
    lines = ["", "### Per-benchmark accuracy (%, mean ± sd over seeds)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in tb["methods"].values():
        lines.append("| " + " | ".join([m["label"], *(pct_pm(m["domains"].get(d, {})) for d in domains)]) + " |")
    return lines


def _learning_section(tb: dict[str, Any], control: str) -> list[str]:
    """After - before per benchmark, for Table 1's methods: does the control learn in every domain?"""
    rows = [m for m in _methods(tb, "main") if (m.get("learning") or {}).get("balanced", {}).get("seeds")]
    if not any(m["label"] == control for m in rows):
        return []
    domains = _by_family(tb)
    header = ["Method", "balanced", *domains]
    lines = ["", ("### Does the control learn? Change after − before GRPO (pp, mean [95% CI (t)] over seeds, "
             "each seed against its own start; * both the t and the bootstrap interval exclude 0)"), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in rows:
        change = m["learning"]
        cells = [_change_cell(change["balanced"]), *(_change_cell(change["domains"].get(d)) for d in domains)]
        lines.append("| " + " | ".join([m["label"], *cells]) + " |")
    return lines + ["", ("A benchmark the control does not raise (its interval reaching 0 or below) cannot "
                        "show a data policy's gain there.")]


def _change_cell(change: dict[str, Any] | None) -> str:
    if not change or not change.get("seeds"):
        return "n/a"
    # Equal changes on every seed give a zero-width interval: no evidence of a spread, so no star.
    mark = " *" if change["excludes_zero"] and (change.get("sd") or 0) > 0 else ""
    return f"{signed_pp(change['mean'])} {interval(change['t'])}{mark}"


def _owner_section(tb: dict[str, Any]) -> list[str]:
    """Multi-owner runs (`owners = N`): each owner's own target test accuracy and epsilon spent, per
    method (mean ± sd over seeds), from each run's summary.json owners.<name>."""
    names = sorted({name for m in tb["methods"].values() for name in m.get("owners", {})})
    if not names:
        return []
    families = tb.get("benchmark_families", {})

    def title(name: str) -> str:
        domains = next((m["owners"][name]["target_domains"] for m in tb["methods"].values()
                        if m.get("owners", {}).get(name, {}).get("target_domains")), [])
        groups = sorted({families.get(d, d) for d in domains})
        return f"{name} ({', '.join(groups)})" if groups else name

    lines = ["", "### Per-owner accuracy and budget (%, mean ± sd over seeds; epsilon spent)", "",
             "| Method | " + " | ".join(title(n) for n in names) + " |", "|" + "---|" * (len(names) + 1)]
    for m in tb["methods"].values():
        cells = []
        for name in names:
            owner = m.get("owners", {}).get(name)
            if owner is None:
                cells.append("n/a")
                continue
            eps = owner["epsilon_spent"]
            lost = f", lost in {owner['lost_runs']} of {owner['runs']}" if owner["lost_runs"] else ""
            eps_text = "n/a" if eps.get("mean") is None else f"{eps['mean']:.2f}"
            cells.append(f"{pct_pm(owner['accuracy'])} (ε {eps_text}{lost})")
        lines.append(f"| {m['label']} | " + " | ".join(cells) + " |")
    return lines


def _has_seeds(delta: dict[str, Any] | None) -> bool:
    return bool(delta and delta["seeds"])


def _delta_sd_cells(entry: dict[str, Any], delta: dict[str, Any] | None, control: str) -> list[str]:
    """Mean paired difference, sd of the per-seed differences, paired t interval."""
    if entry["label"] == control:
        return ["(control)", "—", "—"]
    if not _has_seeds(delta):
        return ["n/a", "n/a", "n/a"]
    return [signed_pp(delta["mean"]), pct(delta.get("sd"), 2), interval(delta["t"])]


def _area_section(tb: dict[str, Any], control: str) -> list[str]:
    """The secondary metric next to accuracy: each run's normalised area under its own
    accuracy-vs-rollouts curve (stats.normalised_area), mean ± sd, and paired against the control
    like accuracy (same seeds, same starting checkpoint). sd(d) is the sd of the paired per-seed
    differences: the seed noise each metric leaves. Runs with fewer than 2 evaluations have no area."""
    methods = list(tb["methods"].values())
    if not methods:
        return []
    lines = ["", "### Secondary metric: area under the accuracy-vs-rollouts curve", "",
             ("**Area**: the trapezoid area under a run's own target-test accuracy vs cumulative rollouts "
              "(its evaluations at step 0, every `eval_every` steps and the final step), divided by the "
              "rollout span: its mean accuracy over the rollouts spent, in %. Paired like accuracy; sd(d) is "
              "the sd of the paired per-seed differences (pp). With few evaluations the area is coarse."), "",
             (f"| Method | Bal. avg | Δ vs {control} (pp) | sd(d) | 95% CI (t) | Area | Δ area (pp) | sd(d) | "
              "95% CI (t) | 95% CI (boot) | Seeds with area |"), "|" + "---|" * 11]
    for m in methods:
        accuracy, area = m.get("delta_vs_control"), m.get("delta_area_vs_control")
        boot = "—" if m["label"] == control else (interval(area["bootstrap"]) if _has_seeds(area) else "n/a")
        cells = [m["label"], pct_pm(m["balanced"]), *_delta_sd_cells(m, accuracy, control),
                 pct_pm(m["area"]), *_delta_sd_cells(m, area, control), boot,
                 f"{m['area']['n']}/{len(m['seeds_ok'])}"]
        lines.append("| " + " | ".join(cells) + " |")
    missing = {m["label"]: m["seeds_without_area"] for m in methods if m.get("seeds_without_area")}
    if missing:
        lines += ["", "No area (fewer than 2 target-test evaluations): "
                  + "; ".join(f"{label} seeds {seeds}" for label, seeds in missing.items())]
    return lines


def _base_rate_section(tb: dict[str, Any], control: str) -> list[str]:
    """Is a gain in the skill or in the answer base rate? (lab/base_rates.py) The accuracy of always
    giving the commonest answer, and each method's accuracy on the prompts whose answer is not
    the commonest; also the runs left unpaired because they started from another checkpoint."""
    rate = tb.get("commonest_answer_accuracy")
    rows = [m for m in tb["methods"].values() if m.get("uncommon")]
    unpaired = {m["label"]: m["unpaired_seeds"] for m in tb["methods"].values() if m.get("unpaired_seeds")}
    lines: list[str] = []
    if rate is not None:
        lines += ["", "### Answer base rates", "",
                  (f"Always giving each target domain's commonest answer scores {pct(rate)}% on the test split. "
                   "**Uncommon** is the accuracy on the test prompts whose answer is not the commonest one "
                   "(measured locally, greedy, final checkpoint): a policy that only guesses the base rate "
                   "scores 0 there."), ""]
    if rows:
        lines += [f"| Method | Uncommon (%) | Δ vs {control} (pp) | 95% CI (t) | 95% CI (boot) | Seeds |",
                  "|---|---|---|---|---|---|"]
        for m in rows:
            delta = m.get("delta_uncommon_vs_control")
            cells = ["(control)", "—", "—"] if m["label"] == control else (
                [signed_pp(delta["mean"]), interval(delta["t"]), interval(delta["bootstrap"])] if delta
                else ["n/a", "n/a", "n/a"])
            lines.append(f"| {m['label']} | {pct_pm(m['uncommon'])} | " + " | ".join(cells)
                         + f" | {m['uncommon']['n']} |")
    if unpaired:
        lines += ["", "Left out of the paired differences (another starting checkpoint than the control's "
                  "on that seed): " + "; ".join(f"{label} seeds {seeds}" for label, seeds in unpaired.items())]
    if len(tb.get("starting_checkpoints", [])) > 1:
        lines += ["", f"Note: these runs started from {len(tb['starting_checkpoints'])} different checkpoints."]
    return lines


def _testbed_section(key: str, tb: dict[str, Any], control: str, figures: dict[str, str]) -> list[str]:
    grouped = bool(tb.get("grouped"))
    domains = tb["families"] if grouped else tb["domains"]
    columns = "families" if grouped else "domains"
    lines = [f"## Testbed `{tb['testbed']}`", ""]
    initial = tb["initial_balanced"]
    if initial["mean"] is not None:
        lines += [(f"Initial checkpoint (before GRPO): {pct_pm(initial)}% balanced accuracy "
                   f"(over {initial['n']} runs; every method starts from the same cached tiny policy)."), ""]
    lines += [f"### Table 1: methods vs {control}", "", *_table_header(domains, control)]
    lines += [_table_row(m, domains, control, columns=columns) for m in _methods(tb, "main")]
    lines += _family_section(tb, control)
    lines += _sensitivity_section(tb, control)
    lines += _benchmark_section(tb, control)
    lines += _learning_section(tb, control)
    lines += _owner_section(tb)
    ablations = _methods(tb, "ablation")
    if ablations:
        ablated = {m["policy"] for m in ablations}  # the full method of an ablation runs the same policy
        full = [m for m in _methods(tb, "main") if m["policy"] in ablated]
        # A coefficient rule's ablations (SetGRPO's) share the control's sampler: the control is not their full method.
        full = [m for m in full if m["label"] != control] or full
        lines += ["", "### Table 2: ablations (each beside its full method)", "", *_table_header(domains, control)]
        lines += [_table_row(m, domains, control, f"{m['label']} (full)", columns) for m in full]
        lines += [_table_row(m, domains, control, columns=columns) for m in ablations]
    diagnostics = _methods(tb, "diagnostic")
    if diagnostics:
        lines += ["", "### Diagnostics and variants", "",
                  ("Simulation-only references (oracle mix, target-mix) and variants (hypergradient "
                   "estimator, checkpoint selection by target feedback); not deployable rows of Table 1."), "",
                  *_table_header(domains, control)]
        lines += [_table_row(m, domains, control, columns=columns) for m in diagnostics]
    lines += _area_section(tb, control)
    lines += _base_rate_section(tb, control)
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
                + "".join(f"{pct(v[columns].get(d))} | " for d in domains)
                + f"{count(v['rollouts'])} | {pct(v['balanced_before'])} | "
                + eps_text + " |")
    if figures:
        lines += ["", "### Figures", ""]
        lines += [f"![{title}]({path})" for title, path in figures.items()]
    return lines


def _dp_line(spec: dict[str, Any]) -> str:
    """The spec's DP setting, and the rows that set their own (MethodSpec.no_dp)."""
    default = bool(spec["no_dp"])
    own = [m["label"] for m in spec["methods"] if m.get("no_dp") is not None and bool(m["no_dp"]) != default]
    text = "off (--no-dp)" if default else "on"
    return text + (f"; {'on' if default else 'off (--no-dp)'} for {', '.join(own)}" if own else "")


def render_report(results: dict[str, Any], figures: dict[str, dict[str, str]] | None = None) -> str:
    """The whole report.md text. `figures` maps testbed key -> {title: relative PNG path}."""
    spec = results["spec"]
    control = results["control"]
    counts = ", ".join(f"{n} {status}" for status, n in results["run_counts"].items())
    lines = [
        f"# Bench report: {spec['name']}", "",
        (f"- seeds: {', '.join(str(s) for s in spec['seeds'])} (matched across methods); steps: {spec['steps']}; "
         f"testbeds: {', '.join(spec['testbeds'])}"),
        f"- control: {control}; DP: {_dp_line(spec)}; runs: {counts}",
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
