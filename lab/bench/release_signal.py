"""How much can one release tell? The per-release difference between two clusters' lookahead
estimates, measured in L2RR runs, against the owner's DP noise on a released value (prints a
table; not a test).

    python -m lab.bench.release_signal RUN_DIR [RUN_DIR ...] --pair add:crawl
        [--feedback-size 105 --epsilon 8 --planned-releases 150 --sample-rate 0.5 --delta 1e-6]

RUN_DIRs are `trainer-node simulate` run directories of one L2RR method (a bench's
OUT/runs/<testbed>/<label>/seed*). Each run's metrics.jsonl logs, at every step, the last raw
hypergradient per cluster (`hypergrad/<cluster>`: for the lookahead estimator, acc(candidate) -
acc(base) of the latest release); a release is a step where `feedback_queries` grew. For the pair
A:B the table gives the per-release difference d = hypergrad/A - hypergrad/B: its mean over all
releases, its sd from release to release, and the mean over releases of each run (the seeds'
sd of that mean is what the bench's paired interval sees).

Runs from this version on also log, at each release, the noise std the owner reported for each
released value (`feedback_noise_std`; a difference release's is calibrated to its clip,
`feedback_clip`): the table then gives the DP noise each release actually carried, sqrt(2) times
that on a difference of two clusters, and the ratio of the mean d to it, per release and for a
run's mean over its R releases (whose noise sd is that over sqrt(R)). "right sign" is the share of
releases with d > 0 (A should beat B: --pair SKILL:HARMFUL).

With the owner's privacy settings it also prints the DP noise of one released accuracy: the
calibrated noise multiplier z (protocol.privacy.accountants, the owner's own calibration, for
`planned_releases` single-candidate releases at epsilon, delta), over the expected subsample
q * N: sd = z / (q N) per candidate, sqrt(2) times that on a difference of two candidates. From
the measured mean d and the run's mean number of releases R it gives the feedback-split size N
at which R releases would resolve d at two standard errors of DP noise alone:
2 * sqrt(2) * z / (q N) / sqrt(R) <= |d|. Run it on DP-off runs to read the exact signal, and on
DP-on runs to see the noise the sampler actually got.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

NOISE_KEY = "feedback_noise_std"
CLIP_KEY = "feedback_clip"


def releases_of_run(run_dir: Path, clusters: Sequence[str]) -> list[dict[str, float]]:
    """The raw hypergradient of each release of one run, for `clusters` (a release: a step whose
    record counts more feedback queries than the one before), with the owner's reported noise std
    and the clip of that release where the run logged them (keys NOISE_KEY, CLIP_KEY)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (a simulate run directory is expected)")
    out: list[dict[str, float]] = []
    seen = 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves a partial last line
        if record.get("kind") != "train":
            continue
        queries = int(record.get("feedback_queries") or 0)
        if queries > seen:
            missing = [c for c in clusters if f"hypergrad/{c}" not in record]
            if missing:
                raise ValueError(f"{run_dir}: step {record.get('step')} logs no hypergrad/{missing[0]} "
                                 f"(clusters logged: {sorted(k[10:] for k in record if k.startswith('hypergrad/'))})")
            release = {c: float(record[f"hypergrad/{c}"]) for c in clusters}
            release.update({key: float(record[key]) for key in (NOISE_KEY, CLIP_KEY) if key in record})
            out.append(release)
        seen = max(seen, queries)
    return out


def logged_clusters(run_dir: Path) -> list[str]:
    """The clusters whose hypergradient a run logged (the first train record that has any)."""
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        names = sorted(k[len("hypergrad/"):] for k in record if k.startswith("hypergrad/"))
        if record.get("kind") == "train" and names:
            return names
    return []


def cluster_means(run_dirs: Sequence[Path]) -> dict[str, float]:
    """Each cluster's mean released value over every release of the runs: with difference releases,
    the mean one-step accuracy change of a candidate along that cluster's direction."""
    clusters = logged_clusters(run_dirs[0]) if run_dirs else []
    releases = [r for d in run_dirs for r in releases_of_run(d, clusters)]
    return {c: float(np.mean([r[c] for r in releases])) for c in clusters} if releases else {}


def signal(run_dirs: Sequence[Path], a: str, b: str) -> dict[str, float]:
    """Per-release d = A - B over the runs: mean, sd per release, the runs' means and their sd, the
    share with d > 0, and (runs that logged it) the owner's noise on d and the clips."""
    runs = [releases_of_run(d, (a, b)) for d in run_dirs]
    per_run = [[r[a] - r[b] for r in run] for run in runs]
    pooled = np.array([x for run in per_run for x in run], dtype=np.float64)
    run_means = np.array([np.mean(run) for run in per_run if run], dtype=np.float64)
    noise = np.array([math.sqrt(2) * r[NOISE_KEY] for run in runs for r in run if NOISE_KEY in r])
    clips = np.array([r[CLIP_KEY] for run in runs for r in run if r.get(CLIP_KEY, 0) > 0])
    releases_per_run = float(pooled.size / len(per_run)) if per_run else math.nan
    noise_sd = float(noise.mean()) if noise.size == pooled.size and pooled.size else math.nan
    mean = float(pooled.mean()) if pooled.size else math.nan
    return {
        "runs": len(per_run), "releases": int(pooled.size),
        "releases_per_run": releases_per_run,
        "mean": mean,
        "sd_per_release": float(pooled.std(ddof=1)) if pooled.size > 1 else math.nan,
        "run_mean_sd": float(run_means.std(ddof=1)) if run_means.size > 1 else math.nan,
        "exact_zero_share": float(np.mean(pooled == 0.0)) if pooled.size else math.nan,
        "right_sign_share": float(np.mean(pooled > 0.0)) if pooled.size else math.nan,
        "noise_sd_on_d": noise_sd,
        "clip_median": float(np.median(clips)) if clips.size else math.nan,
        "signal_to_noise_per_release": mean / noise_sd if noise_sd > 0 else math.nan,
        "signal_to_noise_per_run": mean / (noise_sd / math.sqrt(releases_per_run)) if noise_sd > 0 else math.nan,
    }


def dp_noise(feedback_size: int, epsilon: float, delta: float, planned_releases: int, sample_rate: float) -> dict:
    """The owner's noise on one released accuracy (per candidate): z / (q N)."""
    from protocol.privacy.accountants import calibrate_noise_multiplier

    z = calibrate_noise_multiplier(epsilon, delta, sample_rate, planned_releases)
    return {"noise_multiplier": z, "sd_per_candidate": z / (sample_rate * feedback_size)}


def needed_feedback_size(d: float, releases: float, noise_multiplier: float, sample_rate: float) -> float:
    """Smallest N with 2 * sqrt(2) * z / (q N) / sqrt(R) <= |d| (inf when d is 0)."""
    if d == 0 or releases <= 0:
        return math.inf
    return 2 * math.sqrt(2) * noise_multiplier / (sample_rate * abs(d) * math.sqrt(releases))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--pair", required=True, metavar="A:B",
                        help="two cluster names, e.g. add:crawl; A,B where a name has a colon (count:medium,crawl)")
    parser.add_argument("--feedback-size", type=int, help="the owner's feedback split N (prints the DP part)")
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--planned-releases", type=int, default=150)
    parser.add_argument("--sample-rate", type=float, default=0.5)
    parser.add_argument("--per-cluster", action="store_true",
                        help="also print each cluster's mean released value (its one-step effect on the target)")
    args = parser.parse_args(argv)
    a, sep, b = args.pair.partition("," if "," in args.pair else ":")
    if not sep or not a or not b:
        parser.error(f"--pair: expected A:B (two cluster names), got {args.pair!r}")
    s = signal(args.run_dirs, a, b)
    pp = 100.0
    print(f"d = hypergrad/{a} - hypergrad/{b} per release, {s['runs']} runs, {s['releases']} releases "
          f"({s['releases_per_run']:.1f} per run):")
    print(f"  mean {s['mean'] * pp:+.3f} pp   sd per release {s['sd_per_release'] * pp:.3f} pp   "
          f"sd over runs of each run's mean {s['run_mean_sd'] * pp:.3f} pp   exactly 0: {s['exact_zero_share']:.0%}   "
          f"right sign (d > 0): {s['right_sign_share']:.0%}")
    if math.isfinite(s["noise_sd_on_d"]):
        clip = f", median clip {s['clip_median'] * pp:.3f} pp" if math.isfinite(s["clip_median"]) else ""
        if s["noise_sd_on_d"] > 0:
            print(f"  DP noise the releases carried (owner-reported, on d): sd {s['noise_sd_on_d'] * pp:.3f} pp{clip}; "
                  f"mean d / noise sd: {s['signal_to_noise_per_release']:.2f} per release, "
                  f"{s['signal_to_noise_per_run']:.2f} for a run's mean of {s['releases_per_run']:.1f} releases")
        else:
            print(f"  exact releases (the owner added no noise){clip}")
    if args.per_cluster:
        means = cluster_means(args.run_dirs)
        print("  mean released value per cluster: " + ", ".join(f"{c} {v * pp:+.3f} pp" for c, v in means.items()))
    if args.feedback_size:
        noise = dp_noise(args.feedback_size, args.epsilon, args.delta, args.planned_releases, args.sample_rate)
        sd = noise["sd_per_candidate"]
        need = needed_feedback_size(s["mean"], s["releases_per_run"], noise["noise_multiplier"], args.sample_rate)
        print(f"DP noise (epsilon {args.epsilon:g}, delta {args.delta:g}, {args.planned_releases} planned releases, "
              f"q {args.sample_rate:g}, N {args.feedback_size}): z = {noise['noise_multiplier']:.3f}, "
              f"sd {sd * pp:.2f} pp per candidate, {math.sqrt(2) * sd * pp:.2f} pp on a difference")
        print(f"  DP noise / |mean d| per release: {math.sqrt(2) * sd / abs(s['mean']):.1f}x"
              if s["mean"] else "  mean d is 0: no feedback-split size resolves it")
        if math.isfinite(need):
            print(f"  feedback-split size at which {s['releases_per_run']:.1f} releases resolve the mean d at "
                  f"2 standard errors of DP noise: N >= {math.ceil(need):,}")


if __name__ == "__main__":
    main()
