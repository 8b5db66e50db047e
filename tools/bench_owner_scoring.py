"""What one query costs the owner: its worker's scoring of each candidate, timed (prints figures; not a test).

    python tools/bench_owner_scoring.py RUN_DIR [--models 5] [--dtypes float32,bfloat16] [--rows 90]
    python tools/bench_owner_scoring.py RUN_DIR --release accuracy,difference:importance,\
difference:answer_probability,difference:log_ratio [--candidates 4] [--repeats 5]

RUN_DIR is a finished `trainer-node simulate` run (its owner/ folder holds the owner's config,
its held-out split and the checkpoints the run sent). Each checkpoint is scored the way the
evaluation worker scores a query's candidates (target_owner_node/worker.py: one resident model,
weights applied in place, `score_split` at the owner's fixed batch and prompt width), one
thread, in each dtype; then one dry run (what a new checkpoint structure costs at upload).

--release compares release kinds instead (issue 40, "Cost"): one query of a base and C stored
checkpoints, answered by the worker's own `_score` (an accuracy release: generation + verifier
for every checkpoint scored) and `_differences` (RELEASE_KIND_ACCURACY_DIFFERENCE: the base's
completions once, then one teacher-forced pass per checkpoint), on the same rows, with the
run's decodings: an accuracy release decodes as the run's feedback queries do ([feedback], or
the trainer's FeedbackSettings defaults), a difference release as OwnerFeedback._query_decoding
rewrites it ([policy.release] samples_per_prompt and temperature). "accuracy" scores the C
candidates only (L2RR's release_base = false, the default), "accuracy+base" the base too; a
difference release always needs the base. The kinds run interleaved, a warm-up of each first,
so their ratios are measured side by side on a shared machine. Rows default to the owner's
public rows_per_query (what every DP query scores).

Why: on a 2-core machine the simulated owner scores beside the trainer, and a lookahead query
is a base and C candidates, each a full fixed-shape batch. Its latency past max_staleness steps
is time the trainer waits (docs/RESULTS.md §6.8). The figures here are the owner's side of that.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ACCURACY = "accuracy"
ACCURACY_WITH_BASE = "accuracy+base"
DIFFERENCE = "difference"


def owner_folder(run_dir: Path) -> Path:
    """RUN_DIR's owner/ folder; FileNotFoundError when RUN_DIR is not a finished simulate run."""
    owner = run_dir.resolve() / "owner"
    if not (owner / "config.toml").is_file():
        raise FileNotFoundError(f"{owner / 'config.toml'} not found: RUN_DIR must be a finished simulate run")
    return owner


def owner_of(run_dir: Path) -> tuple:
    """A finished simulate run's owner, as its evaluation worker sees it: (worker spec, held-out
    split, the stored checkpoints' folders, sorted). Changes into the owner's folder, since its
    config names its files relative to it. FileNotFoundError as owner_folder.
    bench_owner_beside.py scores with it too."""
    from target_owner_node.config import load_config
    from target_owner_node.node import worker_spec
    from target_owner_node.worker import _load

    owner = owner_folder(run_dir)
    os.chdir(owner)
    spec = worker_spec(load_config(owner / "config.toml"))
    stored = sorted(p for p in (owner / "storage" / "materialized").iterdir() if p.is_dir())
    return spec, _load(spec.heldout_path, spec.verifier), stored


def query_decoding(max_new_tokens: int) -> dict:
    """A feedback query's decoding as the worker receives it (one sample per row, as simulate asks)."""
    return {"max_new_tokens": max_new_tokens, "samples_per_prompt": 1, "seed": 1, "temperature": 1.0}


def parse_releases(text: str) -> list[tuple[str, str]]:
    """--release: 'accuracy', 'accuracy+base', 'difference:METRIC' (or 'difference': every registered
    metric), comma-separated -> [(kind, metric or '')]. ValueError naming what is unknown."""
    from rlvr_core.differences import difference_metric_names

    known = difference_metric_names()
    releases: list[tuple[str, str]] = []
    for item in (part.strip() for part in text.split(",")):
        kind, _, metric = item.partition(":")
        if kind in (ACCURACY, ACCURACY_WITH_BASE) and not metric:
            releases.append((kind, ""))
        elif kind == DIFFERENCE and not metric:
            releases.extend((DIFFERENCE, name) for name in known)
        elif kind == DIFFERENCE and metric in known:
            releases.append((DIFFERENCE, metric))
        else:
            raise ValueError(f"unknown release {item!r}: use accuracy, accuracy+base or difference:METRIC "
                             f"(metrics: {', '.join(known)})")
    if not releases:
        raise ValueError("--release names no release")
    return list(dict.fromkeys(releases))


def accuracy_decoding(resolved: dict, max_new_tokens: int | None = None) -> dict:
    """An accuracy query's decoding in the run (trainer_node.training.feedback_settings: [feedback]'s
    samples and temperature, else FeedbackSettings' defaults, greedy; the rollout's max_new_tokens)."""
    from trainer_node.feedback.context import FeedbackSettings

    feedback = resolved.get("feedback") or {}
    return {
        "max_new_tokens": int(max_new_tokens or resolved["rollout"]["max_new_tokens"]),
        "samples_per_prompt": int(feedback.get("samples_per_prompt", FeedbackSettings.samples_per_prompt)),
        "temperature": float(feedback.get("temperature", FeedbackSettings.temperature)),
        "seed": int(resolved["run"]["seed"]),
    }


def difference_decoding(resolved: dict, metric: str, accuracy: dict) -> dict:
    """A difference query's decoding: the accuracy decoding as OwnerFeedback._query_decoding rewrites
    it for the run's [policy.release] (its samples for a metric that samples, else 1; its temperature)."""
    from trainer_node.feedback.release import ReleaseOptions

    options = dict((resolved.get("policy") or {}).get("release") or {})
    release = ReleaseOptions(**{**options, "kind": DIFFERENCE, "metric": metric})
    return {**accuracy, "samples_per_prompt": release.samples_per_prompt if release.samples else 1,
            "temperature": float(release.temperature)}


def digests_of(folder: Path) -> dict[str, str]:
    """{file: sha256}: what the store's manifest gives the worker (only changed files are applied)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def compare_releases(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--release: one query of a base + C candidates per release kind, timed interleaved."""
    import torch

    from target_owner_node.worker import ModelCache, _differences, _score

    try:
        releases = parse_releases(args.release)
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(1)  # as the worker runs on a CPU
    run_dir = args.run_dir.resolve()
    try:
        spec, split, stored = owner_of(run_dir)
    except FileNotFoundError as err:
        parser.error(str(err))
    resolved = json.loads((run_dir / "resolved_config.json").read_text())
    if len(stored) < args.candidates + 1:
        parser.error(f"{len(stored)} stored checkpoints; a query of a base + {args.candidates} needs more")
    rows_cache = run_dir / "owner" / "storage" / "rows_per_query_cache.json"
    rows = args.rows
    if rows is None:
        rows = json.loads(rows_cache.read_text())["rows_per_query"] if rows_cache.is_file() else 90
    rows = list(range(min(rows, len(split.examples))))
    checkpoints = [(p.name, str(p), digests_of(p)) for p in stored[: args.candidates + 1]]
    accuracy = accuracy_decoding(resolved, args.max_new_tokens)
    queries = []  # (label, checkpoints scored, run)
    for kind, metric in releases:
        if kind == DIFFERENCE:
            decoding = difference_decoding(resolved, metric, accuracy)
            queries.append((f"difference:{metric}", len(checkpoints), decoding,
                            lambda c, s, d=decoding, m=metric: _differences(c, s, splits, "feedback", checkpoints,
                                                                            rows, d, m, args.clip)))
        else:
            scored = checkpoints[1:] if kind == ACCURACY else checkpoints
            queries.append((kind, len(scored), accuracy,
                            lambda c, s, p=scored: _score(c, s, splits, "feedback", p, rows, accuracy)))
    splits = {"feedback": split}
    print(f"owner batch {spec.batch_size} rows x prompt width {spec.max_prompt_tokens} tokens; {len(rows)} rows a "
          f"query; base + {args.candidates} candidates from {len(stored)} stored checkpoints of {run_dir}")
    for label, scored, decoding, _ in queries:
        print(f"  {label:31s} scores {scored} checkpoints; decoding {decoding['samples_per_prompt']} sample(s) "
              f"x {decoding['max_new_tokens']} new tokens at temperature {decoding['temperature']}")
    for dtype in args.dtypes.split(","):
        dspec = dataclasses.replace(spec, dtype=dtype)
        cache = ModelCache(dspec)  # one resident model, as the worker's
        seconds: dict[str, list[float]] = {label: [] for label, *_ in queries}
        for repeat in range(args.repeats + 1):  # the first round is the warm-up (it loads the model)
            order = queries[repeat % len(queries):] + queries[: repeat % len(queries)]
            for label, _, _, query in order:
                started = time.perf_counter()
                reply = query(cache, dspec)
                elapsed = time.perf_counter() - started
                if reply[0] != "ok":
                    raise SystemExit(f"{label}: the worker answered {reply}")
                if repeat:
                    seconds[label].append(elapsed)
        applied = _apply_seconds(cache, checkpoints, args.repeats)
        reference = next(label for label, *_ in queries if label in (ACCURACY, ACCURACY_WITH_BASE)) \
            if any(label in (ACCURACY, ACCURACY_WITH_BASE) for label, *_ in queries) else None
        print(f"\n{dtype}, one thread, median of {args.repeats} interleaved repeats after a warm-up "
              f"(ratio vs {reference or 'n/a'}):")
        print(f"  {'release kind/metric':31s} {'s/query':>8s} {'s/candidate':>12s} {'ratio':>6s}   each (s)")
        base = statistics.median(seconds[reference]) if reference else None
        for label, *_ in queries:
            median = statistics.median(seconds[label])
            ratio = f"{median / base:6.2f}" if base else "   n/a"
            print(f"  {label:31s} {median:8.3f} {median / args.candidates:12.3f} {ratio}   "
                  f"{', '.join(f'{s:.2f}' for s in seconds[label])}")
        print(f"  (in each: applying one checkpoint's weights in place, median {applied:.3f} s)")
    return 0


def _apply_seconds(cache, checkpoints, repeats: int) -> float:
    """Median seconds of the ModelCache swapping one stored checkpoint in (part of every query above)."""
    seconds = []
    for index in range(max(2, repeats) * 2):
        checkpoint_id, directory, digests = checkpoints[index % 2]
        started = time.perf_counter()
        cache.get(checkpoint_id, Path(directory), digests)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a finished `trainer-node simulate` run folder")
    parser.add_argument("--models", type=int, default=5, help="checkpoints to score per dtype (first is a warm-up)")
    parser.add_argument("--dtypes", default=None,
                        help="comma-separated evaluation dtypes (default float32,bfloat16; with --release float32)")
    parser.add_argument("--rows", type=int, default=None,
                        help="sampled rows (the fixed batch is the owner's; default 90, with --release the owner's "
                        "rows_per_query)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="the trainer's decoding (default 8, as simulate; with --release the run's)")
    parser.add_argument("--release", default=None,
                        help="compare release kinds on one query: comma-separated accuracy, accuracy+base, "
                        "difference:METRIC (difference alone: every metric). Absent: score checkpoints one by one")
    parser.add_argument("--candidates", type=int, default=4, help="--release: candidates C beside the base")
    parser.add_argument("--repeats", type=int, default=5, help="--release: timed queries of each kind")
    parser.add_argument("--clip", type=float, default=0.05, help="--release: a difference release's clip c")
    args = parser.parse_args(argv)
    if args.release is not None:
        if args.candidates < 1 or args.repeats < 1:
            parser.error("--candidates and --repeats must be >= 1")
        args.dtypes = args.dtypes or "float32"
        return compare_releases(args, parser)
    args.dtypes = args.dtypes or "float32,bfloat16"
    args.rows = 90 if args.rows is None else args.rows
    args.max_new_tokens = 8 if args.max_new_tokens is None else args.max_new_tokens

    import torch

    from target_owner_node.worker import ModelCache, dry_run, score_split

    torch.set_num_threads(1)  # as the worker runs on a CPU
    try:
        spec, split, stored = owner_of(args.run_dir)
    except FileNotFoundError as err:
        parser.error(str(err))
    stored = stored[: max(args.models, 2)]
    rows = list(range(min(args.rows, len(split.examples))))
    decoding = query_decoding(args.max_new_tokens)
    print(f"owner batch {spec.batch_size} rows x prompt width {spec.max_prompt_tokens} tokens, "
          f"{args.max_new_tokens} new tokens; {len(stored)} stored checkpoints of {args.run_dir}")
    engine = None
    for dtype in args.dtypes.split(","):
        dspec = dataclasses.replace(spec, dtype=dtype)
        cache = ModelCache(dspec)
        seconds = []
        for folder in stored:
            engine = cache.get(folder.name, folder)
            started = time.perf_counter()
            score_split(engine, dspec, split, rows, decoding)
            seconds.append(time.perf_counter() - started)
        warm = seconds[1:]
        print(f"  {dtype:9s} scoring one checkpoint: median {statistics.median(warm):.3f} s "
              f"(each: {', '.join(f'{s:.2f}' for s in warm)}; first, loading: {seconds[0]:.2f} s)")
    started = time.perf_counter()
    dry_run(engine, dspec)
    print(f"  dry run of a new structure ({spec.max_samples_per_prompt} samples x {spec.max_new_tokens} new tokens "
          f"on the probe prompts, last dtype): {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
