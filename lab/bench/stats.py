"""Statistics behind the bench tables: pure functions of per-seed numbers.

Definitions (also in the report):
- paired difference: for each seed s run by both, d_s = metric(method, s) - metric(control, s).
  Matched seeds share the initial policy and source order, so d_s removes seed-to-seed
  variation that an unpaired comparison would count as noise.
- paired t interval: mean(d) +- t_{(1+c)/2, n-1} * sd(d) / sqrt(n)   (sd with ddof=1).
- bootstrap interval: percentile interval of the means of `resamples` resamples of d drawn
  with replacement from a seeded generator (n = 3 gives only 10 distinct means: read the t
  interval then).
- paired t test: the two-sided p-value of t = mean(d) / (sd(d) / sqrt(n)) on n - 1 degrees of
  freedom, the test the paired t interval inverts (p < 1 - c exactly when the interval excludes 0).
- Holm adjustment: m p-values sorted ascending, p_(i) becomes max_{j<=i} min(1, (m - j + 1) p_(j)).
  Claiming every comparison whose adjusted p is below alpha keeps the chance of any false claim
  among the m at or below alpha (Holm 1979). A bench compares many methods with one control, and
  at 95% one in twenty unadjusted intervals excludes 0 by chance alone.
- domain-balanced accuracy: the mean over target domains of per-domain accuracy, so a large
  domain cannot hide a regression on a small one. On a multi-domain testbed whose target
  domains are benchmarks grouped into families (DataFlex-RL's math / logic / science), it is
  the mean over families of the mean over each family's benchmarks (DataFlex's DB-12); the
  plain mean over benchmarks is the macro average (its Macro-12), and a named summary (its
  Math-Heavy-6) is the mean over the benchmarks it lists.
- rank correlation of two summaries: Spearman's rho between the methods' mean scores under
  each (ties get average ranks), as DataFlex-RL's Table 8 compares summaries.
- RO ratio: mean over seeds of the control's rollouts / mean over seeds of the method's, i.e.
  the ratio of the two "# Rollout" column entries, as in the paper (DAPO count / method count).
  The mean of the per-seed ratios is reported next to it in results.json.
- area (a secondary metric): the trapezoid area under one run's accuracy-vs-cumulative-rollouts
  curve (its target-test evaluations: step 0, the periodic ones, the final) divided by the
  rollout span, i.e. the curve's mean accuracy over the rollouts spent, in [0, 1]. It averages
  several evaluations of one run, so it can carry less seed noise than the final point alone;
  with few evaluations it is coarse. A run with fewer than 2 evaluations has none.
- rollouts to reach: the first cumulative-rollout count at which an accuracy curve is >= a
  threshold; None ("not reached") when the curve never gets there. The report applies it to
  the seed-mean curve with the control's final mean as threshold, and to each seed's curve
  with the control's final accuracy on the same seed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as scipy_stats


@dataclass(frozen=True)
class Interval:
    """A mean with a confidence interval over n values (low/high NaN when n is too small)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        return bool(self.low > 0 or self.high < 0)

    def to_json(self) -> dict[str, float | int | bool | None]:
        out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}
        out["excludes_zero"] = self.excludes_zero
        return out


def _values(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"expected a flat sequence of numbers, got shape {array.shape}")
    return array


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0.0 for one value, NaN for none)."""
    array = _values(values)
    if array.size == 0:
        return math.nan, math.nan
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student-t interval for the mean of `values` (the paired t interval when they are differences)."""
    array = _values(values)
    n = int(array.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(array.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    half = float(scipy_stats.t.ppf((1 + confidence) / 2, n - 1)) * float(array.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def bootstrap_interval(values: Sequence[float], confidence: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> Interval:
    """Percentile bootstrap interval for the mean, from a generator seeded with `seed`."""
    array = _values(values)
    n = int(array.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    rng = np.random.default_rng(seed)
    means = array[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return Interval(float(array.mean()), float(low), float(high), n)


def paired_differences(method: Mapping[int, float], control: Mapping[int, float]) -> tuple[list[int], np.ndarray]:
    """Seeds present in both (sorted) and the differences method - control on them."""
    seeds = sorted(set(method) & set(control))
    return seeds, np.array([method[s] - control[s] for s in seeds], dtype=float)


_NO_SPREAD = 1e-12  # accuracies are in [0, 1]: a spread this small is rounding


def paired_t_pvalue(differences: Sequence[float]) -> float:
    """Two-sided p-value of the one-sample t test that the mean of `differences` is 0 (NaN for
    fewer than 2 values; with no spread, 1 for a zero mean and 0 otherwise, the limits of t)."""
    array = _values(differences)
    if array.size < 2:
        return math.nan
    if float(array.std(ddof=1)) < _NO_SPREAD:  # float noise of equal values, not a spread
        return 1.0 if abs(float(array.mean())) < _NO_SPREAD else 0.0
    return float(scipy_stats.ttest_1samp(array, 0.0).pvalue)


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of a family of p-values ({name: p}; NaN entries are left out
    of the family and come back NaN). scipy ships only false-discovery-rate control
    (stats.false_discovery_control); the family-wise error rate is what "is any method different
    from the control" asks."""
    finite = sorted((p, name) for name, p in pvalues.items() if p is not None and math.isfinite(p))
    m = len(finite)
    adjusted = {name: math.nan for name in pvalues}
    running = 0.0
    for rank, (p, name) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[name] = running
    return adjusted


def domain_balanced(domain_accuracy: Mapping[str, float]) -> float:
    """Mean over domains of per-domain accuracy (NaN when there are no domains)."""
    values = [float(v) for v in domain_accuracy.values() if v is not None]
    return float(np.mean(values)) if values else math.nan


def family_balanced(domain_accuracy: Mapping[str, float], families: Mapping[str, str] | None = None) -> float:
    """Mean over families of the mean accuracy of each family's domains; a domain missing from
    `families` is its own family (so with no families this is domain_balanced)."""
    by_family: dict[str, list[float]] = {}
    for domain, value in domain_accuracy.items():
        if value is not None:
            by_family.setdefault((families or {}).get(domain, domain), []).append(float(value))
    return float(np.mean([np.mean(v) for v in by_family.values()])) if by_family else math.nan


def family_means(domain_accuracy: Mapping[str, float], families: Mapping[str, str]) -> dict[str, float]:
    """{family: mean accuracy of its domains}, sorted by family."""
    by_family: dict[str, list[float]] = {}
    for domain, value in domain_accuracy.items():
        if value is not None:
            by_family.setdefault(families.get(domain, domain), []).append(float(value))
    return {family: float(np.mean(values)) for family, values in sorted(by_family.items())}


def subset_mean(domain_accuracy: Mapping[str, float], members: Sequence[str]) -> float:
    """Mean accuracy over the listed domains (NaN unless every one of them was measured)."""
    values = [domain_accuracy.get(m) for m in members]
    if not values or any(v is None for v in values):
        return math.nan
    return float(np.mean(values))


def spearman(first: Mapping[str, float], second: Mapping[str, float]) -> tuple[float, int]:
    """Spearman's rho between two scorings of the same items (keys present in both with finite
    values) and how many items it is over; NaN for fewer than 3 items or a constant scoring."""
    keys = sorted(k for k in set(first) & set(second)
                  if first[k] is not None and second[k] is not None
                  and math.isfinite(first[k]) and math.isfinite(second[k]))
    a, b = np.array([first[k] for k in keys]), np.array([second[k] for k in keys])
    if len(keys) < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return math.nan, len(keys)
    return float(scipy_stats.spearmanr(a, b).statistic), len(keys)


def ro_ratio(control_rollouts: Sequence[float], method_rollouts: Sequence[float]) -> float:
    """mean(control rollouts) / mean(method rollouts): > 1 means the method spent fewer."""
    control, method = _values(control_rollouts), _values(method_rollouts)
    if control.size == 0 or method.size == 0 or method.mean() <= 0:
        return math.nan
    return float(control.mean() / method.mean())


def paired_ro_ratios(control: Mapping[int, float], method: Mapping[int, float]) -> dict[int, float]:
    """Per matched seed: control rollouts / method rollouts."""
    return {s: float(control[s] / method[s]) for s in sorted(set(control) & set(method)) if method[s] > 0}


def rollouts_to_reach(curve: Sequence[tuple[float, float]], threshold: float, tolerance: float = 1e-9) -> float | None:
    """First rollouts value of (rollouts, accuracy) points, in rollout order, with accuracy >= threshold.

    `tolerance` absorbs float rounding: the control's own mean curve ends at the threshold.
    """
    for rollouts, accuracy in sorted(curve, key=lambda point: point[0]):
        if accuracy is not None and accuracy >= threshold - tolerance:
            return float(rollouts)
    return None


def normalised_area(curve: Sequence[tuple[float, float]]) -> float | None:
    """Trapezoid area under (rollouts, accuracy) points, in rollout order, divided by the rollout
    span: the mean accuracy over the rollouts. None for fewer than 2 points or a zero span (an
    area is never invented from one evaluation)."""
    # stable sort: points at equal rollouts keep their (step) order
    points = sorted(((float(r), float(a)) for r, a in curve if a is not None), key=lambda point: point[0])
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    area = sum((r1 - r0) * (a0 + a1) / 2 for (r0, a0), (r1, a1) in itertools.pairwise(points))
    return area / (points[-1][0] - points[0][0])


def mean_curve(curves: Sequence[Sequence[tuple[int, float, float]]]) -> list[dict[str, float]]:
    """Average per-seed (step, rollouts, accuracy) curves at the steps every seed evaluated.

    Seeds of one method evaluate at the same steps (run.eval_every), but an adaptive policy's
    cumulative rollouts at a step differ by seed, so both axes are averaged.
    """
    if not curves:
        return []
    by_seed = [{int(step): (float(r), float(a)) for step, r, a in curve if a is not None} for curve in curves]
    common = sorted(set.intersection(*(set(points) for points in by_seed)))
    rows = []
    for step in common:
        rollouts = np.array([points[step][0] for points in by_seed])
        accuracy = np.array([points[step][1] for points in by_seed])
        rows.append({
            "step": step, "rollouts_mean": float(rollouts.mean()), "accuracy_mean": float(accuracy.mean()),
            "accuracy_sd": float(accuracy.std(ddof=1)) if accuracy.size > 1 else 0.0,
            "accuracy_min": float(accuracy.min()), "accuracy_max": float(accuracy.max()), "n": int(accuracy.size),
        })
    return rows
