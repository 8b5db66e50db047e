"""What the owner's scoring costs the trainer's steps when both share this machine (prints numbers; not a test).

    python tools/bench_owner_beside.py RUN_DIR [--cycles 12] [--block 2] [--batch N] [--dtype bfloat16]
        [--max-new-tokens 8] [--nice 19] [--seed 0] [--json OUT.json]

RUN_DIR is a finished `trainer-node simulate` run (its owner/ folder: the owner's config, its
held-out split and the checkpoints the run sent). A child process scores those checkpoints over
and over, the way the owner's evaluation worker scores a query (tools/bench_owner_scoring.py's
setup: one resident model, weights applied in place, the owner's prompt width, one thread), at
the simulated owner's CPU priority ([simulated_owner] nice). Each scoring is one query's rows:
the owner's fixed batch, which `simulate` sets to a query's rows, or those rows in batches of
--batch; in the owner's dtype, or --dtype.

This process runs the simulation's tiny policy through GRPO steps, a rollout then an update at
one thread (tools/bench_tapped_update.py's setup), and stops and resumes the child (SIGSTOP,
SIGCONT): each cycle is --block steps beside the scoring and --block steps alone, in an order
that alternates from cycle to cycle, so that drift in the host's speed hits both alike. Each
step's generation and update are timed by the training thread's CPU clock (what it computed; not
the time it waited for a core) and by the wall clock.

It prints, for generation, update and the whole step, the geometric mean over cycles of
beside / alone, with its paired 95% t-interval. Then, from RUN_DIR's metrics.jsonl, the share of
the run's steps with a query in flight (the owner scoring), and the loop excess the two predict:
that share x (the step's CPU ratio - 1).

Why: issue 14's goal 1 compares L2RR's training loop with its no-feedback ablation in
`simulate`, where the owner scores on this machine's other core while the trainer trains.
bench_cpu_share.py found that a compute-bound loop beside the trainer costs it nothing; this
measures the owner's own work beside the trainer's own work. Linux only (SIGSTOP, nice).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]
PHASES = ("generation", "update", "step")
SCORED_CHECKPOINTS = 3  # the child cycles through this many of the run's stored checkpoints


def score_forever(run_dir: Path, batch: int | None, dtype: str | None, max_new_tokens: int, nice: int) -> None:
    """The child: score RUN_DIR's checkpoints as the owner's worker does until killed. After the
    first scoring (the model loaded and warm) it prints one JSON line: the rows, batch and dtype used."""
    import dataclasses

    import torch
    from bench_owner_scoring import owner_of, query_decoding

    from rlvr_core.models.memory import keep_freed_memory
    from target_owner_node.worker import ModelCache, score_split

    os.nice(nice)
    torch.set_num_threads(1)
    keep_freed_memory()  # as the owner's worker does
    spec, split, stored = owner_of(run_dir)
    if not stored:
        raise SystemExit(f"{run_dir}: the owner stored no checkpoint (storage/materialized is empty)")
    rows = spec.batch_size  # simulate's owner: one full batch per query's rows (lab/owner_process.py)
    spec = dataclasses.replace(spec, batch_size=batch or spec.batch_size, dtype=dtype or spec.dtype)
    cache = ModelCache(spec)
    indices = [i % len(split.examples) for i in range(rows)]
    decoding = query_decoding(max_new_tokens)
    ready = False
    while True:
        for folder in stored[:SCORED_CHECKPOINTS]:
            score_split(cache.get(folder.name, folder), spec, split, indices, decoding)
            if not ready:
                print(json.dumps({"rows": rows, "batch": spec.batch_size, "dtype": spec.dtype}), flush=True)
                ready = True


def in_flight_share(run_dir: Path) -> tuple[int, int]:
    """(steps with a query in flight, steps) of RUN_DIR's metrics.jsonl."""
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in steps if "step_seconds" in r]
    return sum(1 for r in steps if r.get("feedback_in_flight")), len(steps)


def summarize(cycles: list[dict[str, dict[str, list[float]]]], clock: str) -> dict[str, tuple[float, float, float]]:
    """Per phase, the geometric mean over cycles of mean(beside) / mean(alone) and its paired t-interval:
    cycles[c][\"beside\" | \"alone\"][f\"{clock}/{phase}\"] holds the block's per-step seconds."""
    from bench_feedback import paired_interval

    out = {}
    for phase in PHASES:
        key = f"{clock}/{phase}"
        ratios = [statistics.fmean(c["beside"][key]) / statistics.fmean(c["alone"][key]) for c in cycles]
        interval = paired_interval(ratios)
        out[phase] = interval if interval is not None else (ratios[0], float("nan"), float("nan"))
    return out


def predicted_excess(step_ratio: float, busy: int, steps: int) -> float:
    """The loop excess, as a share of the loop, if every step with a query in flight is step_ratio
    slower and the others are not."""
    return busy / steps * (step_ratio - 1.0) if steps else 0.0


def _ready_line(child: subprocess.Popen, timeout_s: float) -> dict | None:
    """The child's JSON line once it has scored once; None if it exits or says nothing in time
    (other output lines are skipped)."""
    import selectors

    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(deadline - time.monotonic(), 0.0)):
                return None
            line = child.stdout.readline()
            if not line:  # end of output: the child exited
                return None
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _on_sigterm(_signum, _frame) -> None:
    raise SystemExit(143)  # through measure()'s finally, which kills the (maybe stopped) child


def measure(run_dir: Path, cycles: int, block: int, seed: int, owner_args: list[str],
            start_timeout_s: float = 600.0) -> tuple[list, dict]:
    """(the cycles' per-step seconds, the owner's rows, batch and dtype); `owner_args`: the child's flags."""
    import tempfile

    from bench_tapped_update import tiny_trainer

    from lab.owner_process import die_with_parent

    trainer, _ = tiny_trainer(seed)
    signal.signal(signal.SIGTERM, _on_sigterm)
    with tempfile.TemporaryFile(mode="w+") as errors:  # a pipe nobody reads could fill and stall the child
        child = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--score-forever", str(run_dir), *owner_args],
            stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            # a stopped child keeps SIGTERM pending, so it must die of SIGKILL; a prctl call, safe after fork
            preexec_fn=functools.partial(die_with_parent, signal.SIGKILL))  # noqa: PLW1509
        step = 0

        def timed_step() -> dict[str, float]:
            nonlocal step
            wall, cpu = time.perf_counter(), time.thread_time()
            groups = trainer.sample_and_rollout(step).groups
            wall_mid, cpu_mid = time.perf_counter(), time.thread_time()
            trainer.update(groups)
            wall_end, cpu_end = time.perf_counter(), time.thread_time()
            step += 1
            return {"cpu/generation": cpu_mid - cpu, "cpu/update": cpu_end - cpu_mid, "cpu/step": cpu_end - cpu,
                    "wall/generation": wall_mid - wall, "wall/update": wall_end - wall_mid, "wall/step": wall_end - wall}

        def child_failed(what: str) -> SystemExit:
            child.kill()
            child.wait()
            errors.seek(0)
            return SystemExit(f"the owner's scoring process {what}:\n{errors.read()[-3000:]}")

        try:
            owner = _ready_line(child, start_timeout_s)
            if owner is None:
                exited = child.poll() is not None
                raise child_failed("ended before its first scoring" if exited
                                   else f"did not start within {start_timeout_s:.0f} s")
            for _ in range(2):  # warm-up: the trainer's allocator and kernels
                timed_step()
            out = []
            for c in range(cycles):
                cycle: dict[str, dict[str, list[float]]] = {"beside": {}, "alone": {}}
                for beside in ((True, False) if c % 2 == 0 else (False, True)):
                    if child.poll() is not None:  # a dead child would make every block "alone"
                        raise child_failed("ended during the measurement")
                    os.kill(child.pid, signal.SIGCONT if beside else signal.SIGSTOP)
                    for _ in range(block):
                        for key, seconds in timed_step().items():
                            cycle["beside" if beside else "alone"].setdefault(key, []).append(seconds)
                out.append(cycle)
            return out, owner
        finally:
            child.kill()  # a stopped process dies of SIGKILL too
            child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a finished `trainer-node simulate` run folder")
    parser.add_argument("--cycles", type=int, default=12,
                        help="cycles of --block steps beside the scoring and --block alone (>= 2)")
    parser.add_argument("--block", type=int, default=2, help="the trainer's steps per block (>= 1)")
    parser.add_argument("--seed", type=int, default=0, help="the trainer's seed (its prompts and sampling)")
    parser.add_argument("--batch", type=int, default=None,
                        help="score a query's rows in batches of this many (default: the owner's evaluation.batch_size)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="the owner's scoring dtype (default: the owner's evaluation.dtype)")
    parser.add_argument("--max-new-tokens", type=int, default=8,
                        help="new tokens per row in the owner's scoring: a query's decoding (simulate asks 8)")
    parser.add_argument("--nice", type=int, default=None,
                        help="the owner's CPU priority, 0-19 (default: [simulated_owner] nice's default)")
    parser.add_argument("--json", type=Path, help="also write every cycle's raw seconds here")
    parser.add_argument("--score-forever", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.nice is None:
        from trainer_node.config import SimulatedOwnerConfig

        args.nice = SimulatedOwnerConfig().nice
    if args.score_forever:
        score_forever(args.run_dir, args.batch, args.dtype, args.max_new_tokens, args.nice)
        return 0
    if args.cycles < 2:
        parser.error(f"--cycles must be >= 2 (a paired interval needs two cycles), not {args.cycles}")
    if args.block < 1:
        parser.error(f"--block must be >= 1 step, not {args.block}")
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch must be a positive number of rows, not {args.batch}")
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be >= 1, not {args.max_new_tokens}")
    if not 0 <= args.nice <= 19:
        parser.error(f"--nice must be between 0 and 19 (as for nice(1)), not {args.nice}")
    from bench_owner_scoring import owner_folder

    try:
        owner_folder(args.run_dir)
        busy, steps = in_flight_share(args.run_dir)  # read first: a run without it fails now, not after measuring
    except FileNotFoundError as err:
        parser.error(str(err))
    owner_args = ["--max-new-tokens", str(args.max_new_tokens), "--nice", str(args.nice)]
    owner_args += (["--batch", str(args.batch)] if args.batch else []) + (["--dtype", args.dtype] if args.dtype else [])
    cycles, owner = measure(args.run_dir, args.cycles, args.block, args.seed, owner_args)
    print(f"the owner's scoring beside the trainer: {args.cycles} cycles of {args.block} steps beside it and "
          f"{args.block} alone (owner: {SCORED_CHECKPOINTS} of the run's checkpoints, {owner['rows']} rows per "
          f"scoring in batches of {owner['batch']}, {owner['dtype']}, {args.max_new_tokens} new tokens, "
          f"nice {args.nice}; trainer: 1 thread)")
    figures = {clock: summarize(cycles, clock) for clock in ("cpu", "wall")}
    for phase in PHASES:
        cells = []
        for clock in ("cpu", "wall"):
            mean, low, high = figures[clock][phase]
            cells.append(f"{clock} {mean:.3f}x [{low:.3f}, {high:.3f}]")
        print(f"  {phase:10s} beside / alone: " + ", ".join(cells))
    step_ratio = figures["cpu"]["step"][0]  # computing slower, not waiting: what the shared machine costs
    print(f"{args.run_dir}: a query in flight in {busy} of {steps} steps; predicted loop excess "
          f"{busy}/{steps} x (CPU step ratio {step_ratio:.3f} - 1) = {predicted_excess(step_ratio, busy, steps):+.1%}")
    if args.json:
        args.json.write_text(json.dumps({"cycles": cycles, "owner": owner, "in_flight_steps": busy, "steps": steps},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
