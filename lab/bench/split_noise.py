"""Would more target test prompts help? The part of a paired seed spread that is the finite test
split, from a bench results.json (prints a table; not a test). Issue 15 item 3's first lever.

    python -m lab.bench.split_noise RESULTS_JSON --pair METHOD:CONTROL [--pair ...] [--testbed KEY]

Each seed's paired difference d_s of final accuracy is the difference D_s the two trained policies
would show on the whole target distribution plus the error e_s of measuring it on N test prompts.
Given the two policies, Var(e_s) = Var(x_a - x_b) / N for per-prompt correctness x, summed over
strata; the strata are the prompts whose answer is the commonest one and the others (`uncommon`),
whose accuracies every simulation records. Per-prompt outcomes are not recorded, so the covariance
of x_a and x_b is bounded two ways:
- independent: Var(x_a - x_b) = p_a (1 - p_a) + p_b (1 - p_b), the usual estimate; two policies
  from one start agree more than that, so it is high for similar policies;
- worst case: P(x_a != x_b) - (p_a - p_b)^2 with the largest disagreement the accuracies allow,
  min(p_a + p_b, 2 - p_a - p_b): an upper bound whatever the per-prompt outcomes.
With k times the prompts, Var(d) would fall by at most mean(Var(e_s)) (1 - 1/k); the table gives the
resulting floor of sd(d) for k = 2 and k -> infinity, and the paired-t half-width at the floor.
Single-domain testbeds only (the uncommon accuracy is recorded per run, not per domain).
"""

from __future__ import annotations

import math

import numpy as np

from lab.bench import stats
from lab.bench.metric_noise import paired_seeds, run_table_cli, split_pair


def strata_of(testbed_key: str) -> tuple[int, int]:
    """(N, N uncommon) of the testbed's test split, rebuilt from its spec (deterministic)."""
    from lab.base_rates import uncommon_examples
    from rlvr_core.tasks.testbed import build_testbed_data, load_testbed

    spec = load_testbed(testbed_key)
    if len({entry.domain for entry in spec.target}) != 1:
        raise SystemExit(f"testbed {testbed_key!r}: more than one target domain; this table needs one")
    test = build_testbed_data(spec).test
    return len(test), len(uncommon_examples(test))


def stratum_accuracies(run: dict, n: int, n_uncommon: int) -> tuple[float, float]:
    """(accuracy on the commonest-answer prompts, on the uncommon ones) of one run's final checkpoint."""
    overall, uncommon = run["accuracy"], run["uncommon_after"]
    return (overall * n - uncommon * n_uncommon) / (n - n_uncommon), uncommon


def error_variance(a: tuple[float, float], b: tuple[float, float], n: int, n_uncommon: int,
                   worst: bool) -> float:
    """Var(e_s) of d_s = accuracy(a) - accuracy(b) over the N test prompts, stratified."""
    total = 0.0
    for size, p, q in ((n - n_uncommon, a[0], b[0]), (n_uncommon, a[1], b[1])):
        if size == 0:
            continue
        per_prompt = (min(p + q, 2 - p - q) - (p - q) ** 2) if worst else p * (1 - p) + q * (1 - q)
        total += (size / n) ** 2 * per_prompt / size
    return total


def noise_row(tb: dict, method: str, control: str, n: int, n_uncommon: int) -> dict:
    seeds = paired_seeds(tb, method, control)
    runs = [(tb["methods"][method]["per_seed"][str(s)], tb["methods"][control]["per_seed"][str(s)]) for s in seeds]
    runs = [(a, b) for a, b in runs if a.get("uncommon_after") is not None and b.get("uncommon_after") is not None]
    if len(runs) < 2:
        raise SystemExit(f"{method} − {control}: fewer than 2 paired seeds record uncommon-answer accuracy")
    diffs = np.array([a["accuracy"] - b["accuracy"] for a, b in runs])
    variance = float(diffs.var(ddof=1))
    t = stats.t_interval(diffs.tolist())
    t_factor = (t.high - t.mean) / (math.sqrt(variance) / math.sqrt(len(diffs))) if variance > 0 else math.nan
    row = {"n_seeds": len(runs), "mean": float(diffs.mean()), "sd": math.sqrt(variance)}
    for name, worst in (("independent", False), ("worst", True)):
        v = float(np.mean([error_variance(stratum_accuracies(a, n, n_uncommon), stratum_accuracies(b, n, n_uncommon),
                                          n, n_uncommon, worst) for a, b in runs]))
        floor = math.sqrt(max(variance - v, 0.0))
        row[name] = {"sd_error": math.sqrt(v), "share": v / variance if variance > 0 else math.nan,
                     "sd_at_2x": math.sqrt(max(variance - v / 2, 0.0)), "sd_floor": floor,
                     "half_width_floor": t_factor * floor / math.sqrt(len(runs))}
    return row


def table(results: dict, pairs: list[str], testbed: str | None = None) -> list[str]:
    key = testbed or next(iter(results["testbeds"]))
    tb = results["testbeds"][key]
    n, n_uncommon = strata_of(tb.get("testbed", key))
    lines = [f"testbed {key}: N = {n} test prompts, {n_uncommon} uncommon",
             ("| Comparison | seeds | mean d (pp) | sd(d) (pp) | sd of the test-split error, indep. / worst (pp) | "
              "its share of Var(d) | sd(d) at 2x prompts | sd(d) floor, infinite prompts | 95% half-width at the floor |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for pair in pairs:
        method, control = split_pair(tb, pair)
        row = noise_row(tb, method, control, n, n_uncommon)
        ind, worst = row["independent"], row["worst"]
        lines.append(f"| {method} − {control} | {row['n_seeds']} | {100 * row['mean']:+.2f} | {100 * row['sd']:.2f} | "
                     f"{100 * ind['sd_error']:.2f} / {100 * worst['sd_error']:.2f} | "
                     f"{ind['share']:.0%} / {worst['share']:.0%} | "
                     f"≥ {100 * ind['sd_at_2x']:.2f} / ≥ {100 * worst['sd_at_2x']:.2f} | "
                     f"≥ {100 * ind['sd_floor']:.2f} / ≥ {100 * worst['sd_floor']:.2f} | "
                     f"± {100 * ind['half_width_floor']:.2f} / ± {100 * worst['half_width_floor']:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    run_table_cli(table, __doc__, argv)


if __name__ == "__main__":
    main()
