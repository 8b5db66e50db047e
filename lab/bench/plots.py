"""PNG figures from results.json (never from anything else), one set per testbed:

- accuracy_vs_rollouts_<tb>.png: each method's seed-mean balanced accuracy against its
  seed-mean cumulative rollouts at every evaluation, with a min-max band over seeds;
- lambda_sweep_<tb>.png (Figure 2): final balanced accuracy against L2RR's waste weight λ,
  with t-interval bars over seeds;
- sampling_share_<tb>.png (Figure 1): the L2RR sampler's mass per cluster over training and
  the waste counter per cluster, both mean over seeds;
- family_deltas_<tb>.png (DataFlex-RL's Tables 4-5): each selection, reweighting and mixture
  row's paired difference to the control with its 95% t interval, grouped by family;
- control_learning_<tb>.png: does the control learn on this testbed? Its training reward per
  source domain over the steps, and its target test accuracy per benchmark before and after
  GRPO, both mean over seeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _plt().close(fig)
    return path


def accuracy_vs_rollouts(tb: dict[str, Any], path: Path) -> Path | None:
    methods = [m for m in tb["methods"].values() if m["curve"]]
    if not methods:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in methods:
        x = [row["rollouts_mean"] for row in m["curve"]]
        ax.plot(x, [100 * row["accuracy_mean"] for row in m["curve"]], marker="o", label=m["label"])
        ax.fill_between(x, [100 * row["accuracy_min"] for row in m["curve"]],
                        [100 * row["accuracy_max"] for row in m["curve"]], alpha=0.15)
    if tb["control_final_balanced"] is not None:
        ax.axhline(100 * tb["control_final_balanced"], color="grey", linestyle=":", linewidth=1,
                   label="control final")
    ax.set_xlabel("cumulative source rollouts (mean over seeds)")
    ax.set_ylabel("balanced target test accuracy (%)")
    ax.set_title(f"accuracy vs rollouts ({tb['testbed']}; band = min-max over seeds)")
    ax.legend(fontsize="small")
    return _save(fig, path)


def lambda_sweep(tb: dict[str, Any], path: Path) -> Path | None:
    points = sorted((m for m in tb["methods"].values()
                     if m["sweep_point"] and m["lambda"] is not None and m["balanced"]["mean"] is not None),
                    key=lambda m: m["lambda"])
    if not any(m["group"] == "sweep" for m in points):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = [m["lambda"] for m in points]
    y = [100 * m["balanced"]["mean"] for m in points]
    low = [100 * (m["balanced"]["mean"] - m["balanced_ci"]["low"]) if m["balanced_ci"]["low"] is not None else 0
           for m in points]
    high = [100 * (m["balanced_ci"]["high"] - m["balanced"]["mean"]) if m["balanced_ci"]["high"] is not None else 0
            for m in points]
    ax.errorbar(x, y, yerr=[low, high], marker="o", capsize=4)
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.set_xlabel("waste weight λ")
    ax.set_ylabel("balanced target test accuracy (%)")
    ax.set_title(f"L2RR λ sweep ({tb['testbed']}; bars = 95% t interval)")
    return _save(fig, path)


def sampling_share(tb: dict[str, Any], path: Path) -> Path | None:
    # the first main row with per-step q (a run restored from a results.json has none), named in the title
    label = next((name for name, m in tb["methods"].items() if m.get("dynamics") and m["group"] == "main"), None)
    label = label or next((name for name, m in tb["methods"].items() if m.get("dynamics")), None)
    if label is None:
        return None
    dynamics = tb["methods"][label]["dynamics"]
    plt = _plt()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    steps = dynamics["steps"]
    for cluster, series in dynamics["q"].items():
        top.plot(steps, series, label=cluster)
    for cluster, series in dynamics["waste"].items():
        bottom.plot(steps, series, label=cluster)
    top.set_ylabel("sampling share q")
    top.set_title(f"L2RR sampler over training: {label} ({tb['testbed']}; mean over seeds)")
    top.legend(fontsize="x-small", ncol=2)
    bottom.set_ylabel("waste counter")
    bottom.set_xlabel("step")
    return _save(fig, path)


def family_deltas(tb: dict[str, Any], path: Path) -> Path | None:
    rows = [m for family in ("selection", "reweighting", "mixture") for m in tb["methods"].values()
            if m.get("family") == family and (m.get("delta_vs_control") or {}).get("seeds")]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 0.35 * len(rows) + 1.2))
    colours = {"selection": "tab:blue", "reweighting": "tab:orange", "mixture": "tab:green"}
    for y, m in enumerate(reversed(rows)):
        delta = m["delta_vs_control"]
        mean, low, high = (100 * (v if v is not None else float("nan"))
                           for v in (delta["mean"], delta["t"]["low"], delta["t"]["high"]))
        ax.errorbar([mean], [y], xerr=[[mean - low], [high - mean]], fmt="o", capsize=3,
                    color=colours[m["family"]])
    ax.axvline(0, color="grey", linewidth=1)
    ax.set_yticks(range(len(rows)), [f"{m['label']} ({m['family']})" for m in reversed(rows)])
    ax.set_xlabel("Δ balanced accuracy vs control (pp), paired 95% t interval")
    ax.set_title(f"three families ({tb['testbed']})")
    return _save(fig, path)


def control_learning(tb: dict[str, Any], control: str, path: Path) -> Path | None:
    entry = tb["methods"].get(control) or {}
    reward, per_seed = entry.get("training_reward"), entry.get("per_seed") or {}
    if not reward or not per_seed:
        return None
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(reward["steps"], reward["mean"], color="black", linewidth=2, label="all domains")
    for domain, series in reward["domains"].items():
        left.plot(reward["steps"], [float("nan") if v is None else v for v in series], label=domain, alpha=0.8)
    left.set_xlabel("step")
    left.set_ylabel("training reward (mean over seeds)")
    left.set_title(f"{control}: training reward per source domain")
    left.legend(fontsize="small")
    families = tb.get("benchmark_families") or {}
    benchmarks = sorted({b for v in per_seed.values() for b in v["domains"]}, key=lambda b: (families.get(b, b), b))

    def mean_over_seeds(key: str, benchmark: str) -> float:
        values = [v[key][benchmark] for v in per_seed.values() if benchmark in v.get(key, {})]
        return 100 * sum(values) / len(values) if values else float("nan")

    x = range(len(benchmarks))
    right.bar([i - 0.2 for i in x], [mean_over_seeds("domains_before", b) for b in benchmarks], width=0.4,
              label="before GRPO", color="lightgrey")
    right.bar([i + 0.2 for i in x], [mean_over_seeds("domains", b) for b in benchmarks], width=0.4,
              label="after GRPO", color="tab:blue")
    right.set_xticks(list(x), benchmarks, rotation=45, ha="right", fontsize="small")
    right.set_ylabel("target test accuracy (%), mean over seeds")
    right.set_title(f"{control}: per benchmark, {len(per_seed)} seeds ({tb['testbed']})")
    right.legend(fontsize="small")
    return _save(fig, path)


def write_plots(results: dict[str, Any], out: Path) -> dict[str, dict[str, str]]:
    """Write every figure that has data; returns {testbed key: {title: path relative to out}}."""
    out = Path(out)
    figures: dict[str, dict[str, str]] = {}
    for key, tb in results["testbeds"].items():
        made = {
            "Accuracy vs cumulative rollouts": accuracy_vs_rollouts(tb, out / f"accuracy_vs_rollouts_{key}.png"),
            "Figure 2: λ sweep": lambda_sweep(tb, out / f"lambda_sweep_{key}.png"),
            "Figure 1: sampling share and waste per cluster": sampling_share(tb, out / f"sampling_share_{key}.png"),
            "DataFlex-RL's three families: paired Δ vs control": family_deltas(tb, out / f"family_deltas_{key}.png"),
            "Does the control learn here? Training reward and per-benchmark accuracy": control_learning(
                tb, results["control"], out / f"control_learning_{key}.png"),
        }
        figures[key] = {title: path.name for title, path in made.items() if path is not None}
    return figures
