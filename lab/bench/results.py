"""From run records (and each run's metrics.jsonl) to results.json: every number a report shows.

The headline metric is the domain-balanced target test accuracy (stats.family_balanced: on a
multi-domain testbed the mean over domain families of the mean over their benchmarks, else the
mean over target domains) of the final checkpoint; the overall accuracy is kept next to it.
Per method and testbed: per-seed values, mean +- sd per domain (and per family), # rollouts,
RO ratio, the paired difference to the control with both intervals (and to the family control,
e.g. mixtures against `static`), rollouts needed to reach the control's final accuracy, the mean
accuracy-vs-rollouts curve, the secondary metric `area` (stats.normalised_area of each run's
own curve, paired like accuracy), and (L2RR methods) the mean sampling share and waste per cluster.
Per testbed, DataFlex-RL's evaluation-sensitivity check: every summary (domain-balanced, the
macro average over benchmarks, each summary the testbed declares), its method spread, and the
Spearman correlation of the main methods' ranking under it with the domain-balanced ranking.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.bench import stats
from lab.bench.spec import BenchSpec, testbed_key

EVAL_NAME = "target_test"


DOMAIN_BALANCED = "domain_balanced"  # the headline summary's name in results["...]["summaries"]
MACRO = "macro"                      # the plain mean over target domains (benchmarks)


@dataclass(frozen=True)
class SummaryDesign:
    """How a testbed's per-domain accuracies are summarised: benchmark -> family, named subsets."""

    families: dict[str, str]
    named: dict[str, list[str]]

    @property
    def grouped(self) -> bool:
        """True when some family holds several benchmarks (or a benchmark is named apart from its family)."""
        return any(benchmark != family for benchmark, family in self.families.items())

    def names(self) -> list[str]:
        return [DOMAIN_BALANCED, MACRO, *self.named]


def summary_design(testbed: str) -> SummaryDesign:
    """The testbed's benchmark families and declared summaries (rlvr_core.tasks.testbed)."""
    from rlvr_core.tasks.testbed import benchmark_families, load_testbed

    spec = load_testbed(testbed)
    return SummaryDesign(families=benchmark_families(spec), named={k: list(v) for k, v in spec.summaries.items()})


def headline(record: dict[str, Any], families: dict[str, str] | None = None) -> float | None:
    """Domain-balanced accuracy of an eval record or summary-like dict of accuracy/<domain> keys."""
    domains = {k.split("/", 1)[1]: v for k, v in record.items() if k.startswith("accuracy/") and v is not None}
    if domains:
        return stats.family_balanced(domains, families)
    return record.get("accuracy")


def per_seed_values(summary: dict[str, Any], design: SummaryDesign | None = None) -> dict[str, Any]:
    """The reported checkpoint's numbers of one run, from its simulate summary: the final model,
    or the one chosen by target feedback when the run used checkpoint selection."""
    selected = summary.get("target_accuracy_selected") is not None
    suffix = "selected" if selected else "after"
    owners = owner_values(summary, suffix)
    # a multi-owner run: each owner measured its own domains (older summaries have them per owner only)
    domains = summary.get(f"target_domain_accuracy_{suffix}") or merged(o["domains"] for o in owners.values())
    before = summary.get("target_domain_accuracy_before") or merged(
        (o.get("target_domain_accuracy_before") or {}) for o in (summary.get("owners") or {}).values())
    accuracy = summary[f"target_accuracy_{suffix}"]
    families = design.families if design is not None else {}
    balanced = stats.family_balanced(domains, families) if domains else accuracy
    summaries = {DOMAIN_BALANCED: balanced,
                 MACRO: stats.domain_balanced(domains) if domains else accuracy}
    for name, members in (design.named if design is not None else {}).items():
        summaries[name] = stats.subset_mean(domains, members)
    return {
        "checkpoint": f"selected (step {summary['selection']['selected_step']})" if selected else "final",
        "accuracy": accuracy,
        "balanced": balanced,
        "domains": dict(sorted(domains.items())),
        "families": stats.family_means(domains, families),
        "summaries": summaries,
        "accuracy_before": summary.get("target_accuracy_before"),
        "domains_before": dict(sorted(before.items())),
        "balanced_before": stats.family_balanced(before, families) if before else summary.get("target_accuracy_before"),
        "rollouts": summary["rollouts"],
        "owners": owners,
        "epsilon_spent": summary.get("epsilon_spent"),
        "epsilon_budget": summary.get("epsilon_budget"),
        "wall_seconds": summary.get("wall_seconds"),
        # the starting checkpoint's digest: runs pair only from the same start (None: an older record)
        "start": summary.get("initial_checkpoint_sha256"),
        "commonest_answer_accuracy": (summary.get("base_rates") or {}).get("commonest_answer_accuracy"),
        "uncommon_before": summary.get("target_accuracy_uncommon_before"),
        "uncommon_after": summary.get("target_accuracy_uncommon_after"),
    }


def owner_values(summary: dict[str, Any], suffix: str = "after") -> dict[str, dict[str, Any]]:
    """Each owner's numbers of a multi-owner run (`simulate --owners N`: summary.json's owners.<name>);
    {} for a one-owner run."""
    return {name: {"accuracy": owner.get(f"target_accuracy_{suffix}"),
                   "domains": dict(sorted((owner.get(f"target_domain_accuracy_{suffix}") or {}).items())),
                   "target_domains": list(owner.get("target_domains") or []),
                   "epsilon_spent": owner.get("epsilon_spent"), "lost_step": owner.get("lost_step")}
            for name, owner in sorted((summary.get("owners") or {}).items())}


def merged(parts: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in parts:
        out.update(part)
    return dict(sorted(out.items()))


def owner_stats(seeds: dict[int, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per owner over a method's seeds: accuracy and epsilon (mean, sd over the seeds that measured
    it), its target domains, and in how many runs it was lost."""
    names = sorted({name for v in seeds.values() for name in v.get("owners", {})})
    out = {}
    for name in names:
        values = [v["owners"][name] for v in seeds.values() if name in v.get("owners", {})]
        out[name] = {"accuracy": _stat([o["accuracy"] for o in values if o["accuracy"] is not None]),
                     "epsilon_spent": _stat([o["epsilon_spent"] for o in values if o["epsilon_spent"] is not None]),
                     "target_domains": sorted({d for o in values for d in o["target_domains"] or o["domains"]}),
                     "lost_runs": sum(1 for o in values if o["lost_step"] is not None), "runs": len(values)}
    return out


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a run killed mid-write leaves a partial last line
    return records


def eval_curve(metrics: Sequence[dict[str, Any]],
               families: dict[str, str] | None = None) -> list[tuple[int, float, float]]:
    """(step, cumulative rollouts, headline accuracy) of each target-test evaluation."""
    return [(int(r["step"]), float(r["rollouts_cumulative"]), headline(r, families)) for r in metrics
            if r.get("kind") == "eval" and r.get("name") == EVAL_NAME and headline(r, families) is not None]


def policy_dynamics(per_seed_metrics: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any] | None:
    """Mean over seeds of q/<cluster> and waste/<cluster> at each step every seed logged."""
    tables = []
    for metrics in per_seed_metrics:
        train = {int(r["step"]): r for r in metrics if r.get("kind") == "train" and "step" in r}
        tables.append(train)
    if not tables or not all(tables):
        return None
    steps = sorted(set.intersection(*(set(t) for t in tables)))
    keys = sorted({k for t in tables for r in t.values() for k in r if k.startswith(("q/", "waste/"))})
    if not steps or not keys:
        return None
    out: dict[str, Any] = {"steps": steps, "q": {}, "waste": {}}
    for key in keys:
        kind, cluster = key.split("/", 1)
        series = []
        for step in steps:
            values = [t[step].get(key) for t in tables if t[step].get(key) is not None]
            series.append(sum(values) / len(values) if values else None)
        out[kind][cluster] = series
    return out


def training_reward(per_seed_metrics: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any] | None:
    """Mean over seeds of the training reward at each step every seed logged: overall
    (reward_mean) and per source domain (the mean of the domain's reward/<domain>:<task> keys
    logged that step; a task with no rollouts that step is absent, not zero)."""
    tables = [{int(r["step"]): r for r in metrics if r.get("kind") == "train" and "step" in r}
              for metrics in per_seed_metrics]
    if not tables or not all(tables):
        return None
    steps = sorted(set.intersection(*(set(t) for t in tables)))
    if not steps or any(t[step].get("reward_mean") is None for t in tables for step in steps):
        return None

    def domain_mean(record: dict[str, Any], domain: str) -> float | None:
        values = [v for k, v in record.items() if k.startswith(f"reward/{domain}:") and v is not None]
        return sum(values) / len(values) if values else None

    domains = sorted({k.split("/", 1)[1].split(":", 1)[0] for t in tables for r in t.values() for k in r
                      if k.startswith("reward/") and ":" in k})
    out: dict[str, Any] = {"steps": steps, "mean": [sum(t[s]["reward_mean"] for t in tables) / len(tables)
                                                    for s in steps], "domains": {}}
    for domain in domains:
        series = []
        for step in steps:
            values = [v for v in (domain_mean(t[step], domain) for t in tables) if v is not None]
            series.append(sum(values) / len(values) if values else None)
        out["domains"][domain] = series
    return out


def resolved_policy(method: Any, run_dirs: Sequence[Path]) -> Any:
    """The typed policy options a method's runs used: the first run's resolved_config.json
    (what simulate actually ran, every default filled in), else the spec's options parsed the
    same way (a method with no finished run)."""
    from trainer_node.policies.base import parse_policy_options

    for run_dir in run_dirs:
        path = Path(run_dir) / "resolved_config.json"
        if path.is_file():
            return parse_policy_options(json.loads(path.read_text())["policy"])
    return parse_policy_options({**method.options, "name": method.policy})


def sweep_point(method: Any, policy: Any) -> bool:
    """A point of the sweep figure: a `sweep` row, or a main row of a policy with a sweep
    parameter whose only option (if any) is that parameter."""
    if method.group == "sweep":
        return True
    parameter = type(policy).sweep_parameter
    return method.group == "main" and parameter is not None and set(method.options) <= {parameter}


def _stat(values: Sequence[float]) -> dict[str, float | None]:
    mean, sd = stats.mean_sd(values)
    return {"mean": _finite(mean), "sd": _finite(sd), "n": len(values)}


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def same_start(method: dict[int, dict[str, Any]], control: dict[int, dict[str, Any]]) -> tuple[list[int], list[int]]:
    """(seeds both have and whose runs started from the same checkpoint, seeds both have that did
    not). A paired difference is valid only from one start: a tiny policy built on another machine
    or library version is another start. Two records without a digest (older runs) pair as before."""
    common = sorted(set(method) & set(control))
    same = [s for s in common if method[s].get("start") == control[s].get("start")]
    return same, [s for s in common if s not in same]


def _on(seeds: dict[int, Any], keep: list[int]) -> dict[int, Any]:
    return {s: v for s, v in seeds.items() if s in keep}


def _paired(spec: BenchSpec, method: dict[int, float], control: dict[int, float]) -> dict[str, Any]:
    seeds, diffs = stats.paired_differences(method, control)
    t = stats.t_interval(diffs, spec.confidence)
    boot = stats.bootstrap_interval(diffs, spec.confidence, spec.bootstrap_resamples, spec.bootstrap_seed)
    return {
        "seeds": seeds, "diffs": diffs.tolist(), "mean": _finite(t.mean), "t": t.to_json(), "bootstrap": boot.to_json(),
        "sd": _finite(stats.mean_sd(diffs)[1]),  # the seed noise left after pairing
        # "yes" only when both intervals exclude 0; with few seeds the bootstrap is the looser one.
        "excludes_zero": bool(t.excludes_zero and boot.excludes_zero),
    }


def compute_results(spec: BenchSpec, records: Sequence[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Everything the report shows, computed from the records and the runs' metrics files."""
    out = Path(out)
    results: dict[str, Any] = {
        "spec": spec.model_dump(mode="json"),
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commits": sorted({r.get("git_commit", "unknown") for r in records}),
        "control": spec.control,
        "confidence": spec.confidence,
        "headline_metric": "domain-balanced target test accuracy of the final checkpoint",
        "run_counts": {status: sum(1 for r in records if r.get("status") == status)
                       for status in sorted({r.get("status", "missing") for r in records})},
        "runs": list(records),
        "testbeds": {},
    }
    for testbed in spec.testbeds:
        key = testbed_key(testbed)
        ok = [r for r in records if r.get("testbed_key") == key and r.get("status") == "ok"]
        results["testbeds"][key] = _testbed_results(spec, testbed, ok, out / "runs" / key)
    return results


def _testbed_results(spec: BenchSpec, testbed: str, ok: list[dict[str, Any]], runs_dir: Path) -> dict[str, Any]:
    design = summary_design(testbed)
    per_method: dict[str, dict[int, dict[str, Any]]] = {m.label: {} for m in spec.methods}
    for record in ok:
        if record["label"] in per_method:
            per_method[record["label"]][int(record["seed"])] = per_seed_values(record["summary"], design)
    metrics_by_method = {m.label: {s: read_metrics(runs_dir / m.label / f"seed{s}") for s in sorted(per_method[m.label])}
                         for m in spec.methods}
    curves_by_method = {label: {s: eval_curve(m, design.families) for s, m in metrics.items()}
                        for label, metrics in metrics_by_method.items()}
    for label, seeds in per_method.items():  # every method's areas first: a method pairs with the control's
        for s, v in seeds.items():
            v["area"] = stats.normalised_area([(r, a) for _, r, a in curves_by_method[label][s]])
    control = per_method[spec.control]
    control_final = stats.mean_sd([v["balanced"] for v in control.values()])[0] if control else math.nan
    domains = sorted({d for seeds in per_method.values() for v in seeds.values() for d in v["domains"]})
    families = sorted({f for seeds in per_method.values() for v in seeds.values() for f in v["families"]})
    methods = {}
    for method in spec.methods:
        seeds = per_method[method.label]
        metrics = metrics_by_method[method.label]
        policy = resolved_policy(method, [runs_dir / method.label / f"seed{s}" for s in sorted(seeds)])
        curves = curves_by_method[method.label]
        entry: dict[str, Any] = {
            "label": method.label, "policy": method.policy, "group": method.group, "options": method.options,
            "selection": method.selection, "reweighting": method.reweighting, "family": method.family(),
            "lambda": policy.sweep_value(),
            "sweep_point": sweep_point(method, policy),
            "seeds_ok": sorted(seeds),
            "per_seed": {str(s): v for s, v in sorted(seeds.items())},
            "accuracy": _stat([v["accuracy"] for v in seeds.values()]),
            "balanced": _stat([v["balanced"] for v in seeds.values()]),
            "balanced_ci": stats.t_interval([v["balanced"] for v in seeds.values()], spec.confidence).to_json(),
            "domains": {d: _stat([v["domains"][d] for v in seeds.values() if d in v["domains"]]) for d in domains},
            "families": {f: _stat([v["families"][f] for v in seeds.values() if f in v["families"]]) for f in families},
            "summaries": {name: _stat([v["summaries"][name] for v in seeds.values()
                                       if math.isfinite(v["summaries"].get(name, math.nan))])
                          for name in design.names()},
            "rollouts": _stat([v["rollouts"] for v in seeds.values()]),
            "area": _stat(list(_area_by_seed(seeds).values())),
            "seeds_without_area": [s for s, v in sorted(seeds.items()) if v["area"] is None],  # < 2 evaluations
            "owners": owner_stats(seeds),
            "ro_ratio": _finite(stats.ro_ratio([v["rollouts"] for v in control.values()],
                                               [v["rollouts"] for v in seeds.values()])),
            "ro_ratio_per_seed": {str(s): r for s, r in stats.paired_ro_ratios(
                {s: v["rollouts"] for s, v in control.items()}, {s: v["rollouts"] for s, v in seeds.items()}).items()},
            "curve": stats.mean_curve([curves[s] for s in sorted(curves) if curves[s]]),
            "per_seed_curves": {str(s): [list(p) for p in c] for s, c in curves.items()},
        }
        entry["ro_ratio_per_seed_mean"] = _finite(stats.mean_sd(list(entry["ro_ratio_per_seed"].values()))[0])
        entry["learning"] = learning(spec, seeds, domains)
        if method.label != spec.control:
            paired, unpaired = same_start(seeds, control)
            mine, theirs = _on(seeds, paired), _on(control, paired)
            entry["unpaired_seeds"] = unpaired  # another starting checkpoint than the control's
            entry["delta_vs_control"] = _paired(spec, {s: v["balanced"] for s, v in mine.items()},
                                                {s: v["balanced"] for s, v in theirs.items()})
            entry["delta_accuracy_vs_control"] = _paired(spec, {s: v["accuracy"] for s, v in mine.items()},
                                                         {s: v["accuracy"] for s, v in theirs.items()})
            entry["delta_area_vs_control"] = _paired(spec, _area_by_seed(mine), _area_by_seed(theirs))
            entry["summary_deltas"] = {
                name: _paired(spec, _summary_by_seed(mine, name), _summary_by_seed(theirs, name))
                for name in design.names()}
            uncommon = {s: v["uncommon_after"] for s, v in mine.items() if v.get("uncommon_after") is not None}
            control_uncommon = {s: v["uncommon_after"] for s, v in theirs.items()
                                if v.get("uncommon_after") is not None}
            if uncommon and control_uncommon:
                entry["delta_uncommon_vs_control"] = _paired(spec, uncommon, control_uncommon)
        uncommon_after = [v["uncommon_after"] for v in seeds.values() if v.get("uncommon_after") is not None]
        if uncommon_after:
            entry["uncommon"] = _stat(uncommon_after)
        family_control = spec.family_controls.get(entry["family"] or "")
        if family_control is not None and family_control != method.label:
            paired, _ = same_start(seeds, per_method[family_control])
            entry["delta_vs_family_control"] = {
                "control": family_control,
                **_paired(spec, {s: v["balanced"] for s, v in _on(seeds, paired).items()},
                          {s: v["balanced"] for s, v in _on(per_method[family_control], paired).items()}),
            }
        control_by_seed = {s: v["balanced"] for s, v in control.items()}
        entry["reach_control"] = _reach(entry["curve"], curves, control_final, control_by_seed)
        reward = training_reward([metrics[s] for s in sorted(metrics)])  # None: no train records
        if reward is not None:
            entry["training_reward"] = reward
        dynamics = policy_dynamics([metrics[s] for s in sorted(metrics)])  # None: no q/waste metrics
        if dynamics is not None:
            entry["dynamics"] = dynamics
        methods[method.label] = entry
    adjust_for_multiplicity(methods)
    before = [v["balanced_before"] for seeds in per_method.values() for v in seeds.values()
              if v["balanced_before"] is not None]
    rates = [v["commonest_answer_accuracy"] for seeds in per_method.values() for v in seeds.values()
             if v.get("commonest_answer_accuracy") is not None]
    starts = sorted({v["start"] for seeds in per_method.values() for v in seeds.values() if v.get("start")})
    return {"testbed": testbed, "domains": domains, "families": families,
            "commonest_answer_accuracy": rates[0] if rates else None,  # one test split per testbed
            "starting_checkpoints": starts,
            "benchmark_families": design.families, "grouped": design.grouped, "named_summaries": design.named,
            "control_final_balanced": _finite(control_final), "initial_balanced": _stat(before),
            "methods": methods, "evaluation_sensitivity": evaluation_sensitivity(methods, design.names())}


def adjust_for_multiplicity(methods: dict[str, dict[str, Any]]) -> None:
    """Add `p_t` (the paired t test's p, from the comparison's `diffs`) and `p_holm` to every
    headline comparison of one testbed: Holm over all its comparisons with the control, and
    separately over all comparisons with a family control. The report's question is whether any
    method differs, and one interval in twenty excludes 0 by chance. Works on a published
    results.json's methods too (tools/holm_published.py), as it reads only the kept diffs."""
    for key in ("delta_vs_control", "delta_vs_family_control"):
        deltas = {label: m[key] for label, m in methods.items() if m.get(key) and m[key]["seeds"]}
        raw = {label: stats.paired_t_pvalue(d["diffs"]) for label, d in deltas.items()}
        adjusted = stats.holm(raw)
        for label, delta in deltas.items():
            delta["p_t"], delta["p_holm"] = _finite(raw[label]), _finite(adjusted[label])
            delta["holm_family_size"] = sum(1 for p in adjusted.values() if math.isfinite(p))


def learning(spec: BenchSpec, seeds: dict[int, dict[str, Any]], domains: Sequence[str]) -> dict[str, Any]:
    """Does this method raise each benchmark? The change after - before of every benchmark (and
    of the domain-balanced score), paired on each seed's own start: issue 45's check that the
    control learns in every domain before data policies are compared on a testbed."""
    def changes(after: dict[int, float | None], before: dict[int, float | None]) -> dict[str, Any]:
        mine = {s: a for s, a in after.items() if a is not None and before.get(s) is not None}
        return _paired(spec, mine, {s: before[s] for s in mine})

    balanced = changes({s: v["balanced"] for s, v in seeds.items()},
                       {s: v["balanced_before"] for s, v in seeds.items()})
    per_domain = {d: changes({s: v["domains"].get(d) for s, v in seeds.items()},
                             {s: v["domains_before"].get(d) for s, v in seeds.items()}) for d in domains}
    return {"balanced": balanced, "domains": {d: c for d, c in per_domain.items() if c["seeds"]}}


def _area_by_seed(seeds: dict[int, dict[str, Any]]) -> dict[int, float]:
    return {s: v["area"] for s, v in seeds.items() if v.get("area") is not None}


def _summary_by_seed(seeds: dict[int, dict[str, Any]], name: str) -> dict[int, float]:
    return {s: v["summaries"][name] for s, v in seeds.items() if math.isfinite(v["summaries"].get(name, math.nan))}


def evaluation_sensitivity(methods: dict[str, dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Per summary: the main methods' mean scores, their spread (max - min), and Spearman's rho of
    their ranking against the domain-balanced ranking (DataFlex-RL's Table 8).

    Only methods with results on every seed any main method has are ranked: a mean over fewer
    seeds is a mean over other initial policies, so it would rank seeds, not methods. The
    methods left out are listed."""
    with_results = {label: m for label, m in methods.items() if m["group"] == "main" and m["seeds_ok"]}
    all_seeds = sorted({s for m in with_results.values() for s in m["seeds_ok"]})
    main = {label: m for label, m in with_results.items() if m["seeds_ok"] == all_seeds}
    scores = {name: {label: m["summaries"][name]["mean"] for label, m in main.items()
                     if m["summaries"][name]["mean"] is not None} for name in names}
    out: dict[str, Any] = {"methods": list(main), "seeds": all_seeds,  # in spec order
                           "left_out": [label for label in with_results if label not in main], "summaries": {}}
    for name in names:
        rho, n = stats.spearman(scores[DOMAIN_BALANCED], scores[name])
        values = list(scores[name].values())
        out["summaries"][name] = {
            "scores": scores[name], "rho_vs_domain_balanced": _finite(rho), "n_methods": n,
            "spread": _finite(max(values) - min(values)) if values else None,
            "best": max(scores[name], key=scores[name].get) if values else None,
        }
    return out


def _reach(curve: list[dict[str, float]], per_seed: dict[int, list[tuple[int, float, float]]],
           threshold: float, control_by_seed: dict[int, float]) -> dict[str, Any]:
    """Mean curve vs the control's final mean; each seed vs the control's final on that seed."""
    if not math.isfinite(threshold):
        return {"threshold": None, "mean_curve": None, "per_seed": {}, "seeds_reached": 0, "seeds": 0}
    mean_points = [(row["rollouts_mean"], row["accuracy_mean"]) for row in curve]
    per_seed_reach = {str(s): stats.rollouts_to_reach([(r, a) for _, r, a in c], control_by_seed[s])
                      for s, c in per_seed.items() if s in control_by_seed}
    return {
        "threshold": threshold,
        "mean_curve": stats.rollouts_to_reach(mean_points, threshold) if mean_points else None,
        "per_seed": per_seed_reach,
        "seeds_reached": sum(1 for v in per_seed_reach.values() if v is not None),
        "seeds": len(per_seed_reach),
    }


def json_safe(value: Any) -> Any:
    """Recursively replace NaN/inf with None: results.json stays strict JSON."""
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
