"""What one query costs the owner: its worker's scoring of each candidate, timed (prints figures; not a test).

    python tools/bench_owner_scoring.py RUN_DIR [--models 5] [--dtypes float32,bfloat16] [--rows 90]

RUN_DIR is a finished `trainer-node simulate` run (its owner/ folder holds the owner's config,
its held-out split and the checkpoints the run sent). Each checkpoint is scored the way the
evaluation worker scores a query's candidates (target_owner_node/worker.py: one resident model,
weights applied in place, `score_split` at the owner's fixed batch and prompt width), one
thread, in each dtype; then one dry run (what a new checkpoint structure costs at upload).

Why: on a 2-core machine the simulated owner scores beside the trainer, and a lookahead query
is a base and C candidates, each a full fixed-shape batch. Its latency past max_staleness steps
is time the trainer waits (docs/RESULTS.md §6.8). The figures here are the owner's side of that.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a finished `trainer-node simulate` run folder")
    parser.add_argument("--models", type=int, default=5, help="checkpoints to score per dtype (first is a warm-up)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated evaluation dtypes")
    parser.add_argument("--rows", type=int, default=90, help="sampled rows (the fixed batch is the owner's)")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="the trainer's decoding (simulate: 8)")
    args = parser.parse_args(argv)

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
