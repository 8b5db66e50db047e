"""Which metric sees through seed variance? Paired per-seed differences of final accuracy, of the
accuracy at each evaluated step, and of the normalised area under the accuracy-vs-rollouts curve
(lab.bench.stats.normalised_area), from a bench results.json (prints a table; not a test).

    python -m lab.bench.metric_noise RESULTS_JSON --pair METHOD:CONTROL [--pair ...] [--testbed KEY]

RESULTS_JSON is `trainer-node bench ... --report-only`'s OUT/results.json or one of
docs/results/*.json: their per-seed curves are each run's own target-test evaluations. Seeds are
paired as the bench pairs accuracy (shared seed and starting checkpoint; any two methods of the
file, whatever its control). The last evaluation is the final checkpoint unless the run selected
another, so its step row is left out when it equals `final`. For each metric: the
mean paired difference d, sd(d), the paired-t 95% half-width t * sd(d) / sqrt(n), and the
signal-to-noise ratio mean(d) / sd(d); at n seeds the t interval excludes 0 exactly when
|SNR| > t_{0.975, n-1} / sqrt(n) (0.635 at 12 seeds). The last column: a percentile bootstrap
interval (seeds resampled jointly, seeded) of how much further from 0 a metric's SNR is than final
accuracy's, in the direction of final's mean difference (> 0: the metric sees the effect better).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lab.bench import stats
from lab.bench.results import same_start


def paired_seeds(testbed: dict, method: str, control: str) -> list[int]:
    """The bench's pairing rule (lab.bench.results.same_start): seeds both ran, from the same start."""
    def by_seed(label: str) -> dict[int, dict]:
        return {int(s): v for s, v in testbed["methods"][label]["per_seed"].items()}

    return same_start(by_seed(method), by_seed(control))[0]


def metrics_of_run(entry: dict, seed: int) -> dict[str, float | None]:
    """final (the reported checkpoint's balanced accuracy), step<k> for each evaluation, area."""
    curve = entry["per_seed_curves"][str(seed)]
    out: dict[str, float | None] = {"final": entry["per_seed"][str(seed)]["balanced"]}
    for step, _, accuracy in curve:
        out[f"step{int(step)}"] = accuracy
    out["area"] = stats.normalised_area([(rollouts, accuracy) for _, rollouts, accuracy in curve])
    return out


def noise_rows(testbed: dict, method: str, control: str, seeds: list[int]) -> list[dict]:
    """Per metric: n, mean and sd of the paired differences, the t half-width, mean / sd."""
    mine = {s: metrics_of_run(testbed["methods"][method], s) for s in seeds}
    theirs = {s: metrics_of_run(testbed["methods"][control], s) for s in seeds}
    names = [k for k in mine[seeds[0]] if all(k in mine[s] and k in theirs[s] for s in seeds)] if seeds else []
    rows = []
    for name in names:
        kept = [s for s in seeds if mine[s][name] is not None and theirs[s][name] is not None]
        _, diffs = stats.paired_differences({s: mine[s][name] for s in kept}, {s: theirs[s][name] for s in kept})
        ci = stats.t_interval(diffs)
        mean, sd = stats.mean_sd(diffs)
        rows.append({"metric": name, "n": len(kept), "mean": mean, "sd": sd, "diffs": diffs.tolist(), "seeds": kept,
                     "half_width": (ci.high - ci.mean) if math.isfinite(ci.high) else math.nan,
                     "snr": mean / sd if sd > 0 else math.nan, "excludes_zero": ci.excludes_zero})
    return rows


def snr_gain_interval(row: dict, final: dict, resamples: int = 10_000, seed: int = 0,
                      confidence: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of how much further from 0 row's SNR is than final's (SNR
    differences signed by final's mean difference, so > 0 is "sees the effect better" for a loss
    too), over the seeds both have, resampling seeds jointly (a seed's metrics are correlated)."""
    common = [s for s in row["seeds"] if s in final["seeds"]]
    a = np.array([row["diffs"][row["seeds"].index(s)] for s in common])
    b = np.array([final["diffs"][final["seeds"].index(s)] for s in common])
    if len(common) < 3:
        return math.nan, math.nan
    index = np.random.default_rng(seed).integers(0, len(common), size=(resamples, len(common)))

    def snr(values: np.ndarray) -> np.ndarray:
        sd = values.std(axis=1, ddof=1)
        return np.where(sd > 0, values.mean(axis=1) / np.where(sd > 0, sd, 1.0), np.nan)

    direction = 1.0 if b.mean() >= 0 else -1.0
    gains = direction * (snr(a[index]) - snr(b[index]))
    if np.isnan(gains).all():  # a metric with no spread on any resample: no SNR to compare
        return math.nan, math.nan
    alpha = (1 - confidence) / 2
    low, high = np.nanquantile(gains, [alpha, 1 - alpha])
    return float(low), float(high)


def split_pair(tb: dict, pair: str) -> tuple[str, str]:
    """"METHOD:CONTROL" -> (method, control), both labels of the testbed's methods."""
    method, _, control = pair.partition(":")
    for label in (method, control):
        if label not in tb["methods"]:
            raise SystemExit(f"--pair {pair}: no method {label!r}; methods: {', '.join(tb['methods'])}")
    return method, control


def table(results: dict, pairs: list[str], testbed: str | None = None) -> list[str]:
    """Markdown rows, one per (pair, metric). A step row is left out when its differences are all 0
    (step 0: one starting checkpoint) or equal the final's (the last step is the final checkpoint)."""
    key = testbed or next(iter(results["testbeds"]))
    tb = results["testbeds"][key]
    lines = [f"testbed {key}",
             ("| Comparison | Metric | n | mean d (pp) | sd(d) (pp) | 95% half-width (pp) | SNR mean/sd | "
              "CI excludes 0 | |SNR| gain over final, bootstrap 95% |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for pair in pairs:
        method, control = split_pair(tb, pair)
        rows = noise_rows(tb, method, control, paired_seeds(tb, method, control))
        final = next((row for row in rows if row["metric"] == "final"), None)
        for row in rows:
            if row["metric"].startswith("step") and (row["diffs"] == final["diffs"] or not any(row["diffs"])):
                continue
            gain = "—" if row is final else "[{:+.2f}, {:+.2f}]".format(*snr_gain_interval(row, final))
            lines.append(f"| {method} − {control} | {row['metric']} | {row['n']} | {100 * row['mean']:+.2f} | "
                         f"{100 * row['sd']:.2f} | {100 * row['half_width']:.2f} | {row['snr']:+.2f} | "
                         f"{'yes' if row['excludes_zero'] else 'no'} | {gain} |")
    return lines


def run_table_cli(table_of: Callable[[dict, list[str], str | None], list[str]], doc: str | None,
                  argv: list[str] | None = None) -> None:
    """RESULTS_JSON --pair METHOD:CONTROL [...] [--testbed KEY] -> print `table_of`'s rows."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--pair", action="append", required=True, metavar="METHOD:CONTROL")
    parser.add_argument("--testbed", help="testbed key (default: the first)")
    args = parser.parse_args(argv)
    print(f"{args.results}:")
    print("\n".join(table_of(json.loads(args.results.read_text()), args.pair, args.testbed)))


def main(argv: list[str] | None = None) -> None:
    run_table_cli(table, __doc__, argv)


if __name__ == "__main__":
    main()
