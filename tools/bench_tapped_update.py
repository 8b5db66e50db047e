"""Where a lookahead run's extra loop time goes, step by step (prints numbers; not a test).

    python tools/bench_tapped_update.py [--steps 60] [--seed 0] [--isolated 8] [--out /tmp/tapped-update]

Runs `trainer-node simulate` (L2RR, the default lookahead estimator, issue 14's goal-1 config)
and its learn_q = false ablation once each, and sorts the lookahead run's steps (metrics.jsonl)
into three kinds:

- tapped: the update filled a gradient tap (`lookahead_tapped`, trainer_node/grpo/gradient_tap.py);
  it ran its backward class by class, and the background thread starts building, writing and
  uploading the candidates as soon as it ends;
- owner busy: a query is in flight (`feedback_in_flight`), so the owner process is scoring it on
  the machine's other core;
- owner idle: neither.

For each kind it prints the mean step, generation and update seconds beside the ablation's, and
that kind's share of the excess: (kind's mean - ablation's mean) x its step count, as a share of
the ablation's loop. The shares add up to lookahead's loop excess.

`--isolated N` also times the update alone, in this process, with nothing beside it (no owner,
no background thread): a plain update and one that fills a tap of 4 one-cluster candidates,
alternately, N of each, on the simulation's tiny policy at one thread (as `simulate` runs it).
That separates the cost of the class-by-class backward from the cost of what runs beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_feedback  # goal 1's config and runner, so the figures match its runs)

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("step_seconds", "time/generation", "time/update")
KINDS = ("tapped", "owner busy", "owner idle")


def kind_of(record: dict) -> str:
    if record.get("lookahead_tapped"):
        return "tapped"
    return "owner busy" if record.get("feedback_in_flight") else "owner idle"


def mean(records: list[dict], key: str) -> float:
    return sum(r.get(key, 0.0) for r in records) / len(records) if records else float("nan")


def report(ablation: list[dict], lookahead: list[dict]) -> None:
    base_loop = sum(r["step_seconds"] for r in ablation)
    loop = sum(r["step_seconds"] for r in lookahead)
    print(f"loop: ablation {base_loop:.2f} s, lookahead {loop:.2f} s ({loop / base_loop:.3f}x, "
          f"excess {loop - base_loop:+.2f} s = {(loop - base_loop) / base_loop:+.1%} of the ablation's loop)")
    base = {key: mean(ablation, key) for key in PHASES}
    print("  ablation, per step: " + ", ".join(f"{key} {value:.3f} s" for key, value in base.items()))
    for kind in KINDS:
        steps = [r for r in lookahead if kind_of(r) == kind]
        if not steps:
            print(f"  {kind:10s}  0 steps")
            continue
        parts = []
        for key in PHASES:
            value = mean(steps, key)
            excess = (value - base[key]) * len(steps)
            parts.append(f"{key} {value:.3f} s ({value / base[key]:.2f}x, {excess / base_loop:+.1%})")
        print(f"  {kind:10s} {len(steps):2d} steps: " + "; ".join(parts))


def tiny_trainer(seed: int):
    """The simulation's tiny policy in a GRPO trainer at one thread (as `simulate` runs it on a
    CPU), with its first batch of groups: (trainer, groups). bench_owner_beside.py uses it too."""
    import numpy as np
    import torch

    if str(ROOT) not in sys.path:  # the project's packages (lab/ holds the toy workload)
        sys.path.insert(0, str(ROOT))
    from lab.toy_grpo import SAMPLING, make_settings, render, toy_pool, toy_reward
    from rlvr_core.engines.registry import build_engine
    from rlvr_core.models.loading import load_policy
    from rlvr_core.models.memory import keep_freed_memory
    from trainer_node.grpo.trainer import GRPOTrainer
    from trainer_node.policies.base import build_policy

    torch.set_num_threads(1)
    keep_freed_memory()  # as the CPU trainer does (trainer_node/training.py)
    torch.manual_seed(seed)
    model, tokenizer = load_policy(bench_feedback._model_dir(ROOT), "cpu", torch.float32)
    pool = toy_pool()
    policy = build_policy({"name": "uniform", "batch_size": 16, "rollouts_per_prompt": 8}, pool,
                          np.random.default_rng(seed))
    trainer = GRPOTrainer(model=model, tokenizer=tokenizer, engine=build_engine("transformers", model, tokenizer),
                          policy=policy, pool=pool, render=render, reward_fn=toy_reward,
                          settings=make_settings(lr=3e-4), sampling=SAMPLING)
    return trainer, trainer.sample_and_rollout(0).groups


def isolated(repeats: int, seed: int) -> None:
    """Plain and tapped updates of one batch, alternately, in this process (module docstring)."""
    import copy

    trainer, groups = tiny_trainer(seed)
    weights = [[1.0 if g % 4 == c else 0.0 for g in range(len(groups))] for c in range(4)]
    start = copy.deepcopy(trainer.model.state_dict())
    seconds: dict[str, list[float]] = {"plain": [], "tapped": []}
    for i in range(2 * repeats + 2):
        tapped = i % 2 == 1
        trainer.model.load_state_dict(start)
        snapshot = trainer.lookahead_snapshot(groups, weights) if tapped else None
        began = time.perf_counter()
        trainer.update(groups)
        if i >= 2:  # the first pair warms up
            seconds["tapped" if tapped else "plain"].append(time.perf_counter() - began)
        if snapshot is not None and not snapshot.tap.wait():
            raise SystemExit("the tap was declined: nothing to time")
    plain, tapped = (statistics.median(seconds[k]) for k in ("plain", "tapped"))
    rows = sum(len(g.rollouts) for g in groups)
    print(f"isolated update ({rows} rows, 4 classes, 1 thread, median of {repeats}): plain {plain:.3f} s, "
          f"tapped {tapped:.3f} s ({tapped / plain:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--isolated", type=int, default=8, metavar="N",
                        help="time N plain and N tapped updates in-process first (0: skip)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tapped-update"))
    args = parser.parse_args()
    if args.isolated < 0:
        parser.error(f"--isolated must be 0 (skip) or a positive count of updates, not {args.isolated}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.isolated:
        sys.path.insert(0, str(ROOT))
        isolated(args.isolated, args.seed)
    defaults = (ROOT / "lab" / "configs" / "simulate_default.toml").read_text()
    runs = {}
    for label, lines in (("ablation", {"policy": "learn_q = false"}), ("lookahead", {})):
        text = bench_feedback.arm_config(defaults, lines)
        runs[label], _, _ = bench_feedback._run_simulate(ROOT, args.out / label, text, args.steps, args.seed)
    report(runs["ablation"], runs["lookahead"])
    (args.out / "steps.json").write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
