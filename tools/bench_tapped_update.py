"""What a lookahead query costs the training thread's update (prints numbers; not a test).

    python tools/bench_tapped_update.py [--steps 60] [--seed 0] [--out /tmp/tapped-update]

Runs `trainer-node simulate` (L2RR, the default lookahead estimator, issue 14's goal-1 config)
and its learn_q = false ablation once each, and splits each run's per-step phase seconds
(metrics.jsonl) into the steps whose update filled a gradient tap (`lookahead_tapped`,
trainer_node/grpo/gradient_tap.py) and the rest.

Why it is here: a tapped update runs the backward class by class, to hand the query's candidates
their gradients. That work is on the training thread but is booked as `update`, not as a
feedback phase, so the goal-1 report's "feedback phases" figure leaves it out. This prints it:
the tapped updates' seconds per step beside the other updates' in the same run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_feedback  # goal 1's config and runner, so the figures match its runs)

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("time/update", "time/generation", "step_seconds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/tapped-update"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    defaults = (ROOT / "lab" / "configs" / "simulate_default.toml").read_text()
    for label, lines in (("ablation", {"policy": "learn_q = false"}), ("lookahead", {})):
        text = bench_feedback.arm_config(defaults, lines)
        steps, _, _ = bench_feedback._run_simulate(ROOT, args.out / label, text, args.steps, args.seed)
        tapped = [r for r in steps if r.get("lookahead_tapped")]
        rest = [r for r in steps if not r.get("lookahead_tapped")]
        loop = sum(r["step_seconds"] for r in steps)
        print(f"{label}: {len(steps)} steps, {len(tapped)} tapped updates, loop {loop:.2f} s")
        for key in PHASES:
            per_tapped = sum(r.get(key, 0.0) for r in tapped) / max(1, len(tapped))
            per_rest = sum(r.get(key, 0.0) for r in rest) / max(1, len(rest))
            line = f"  {key:16s} per other step {per_rest:.3f} s"
            if tapped:
                extra = (per_tapped - per_rest) * len(tapped)
                line += (f", per tapped step {per_tapped:.3f} s ({per_tapped / per_rest:.2f}x);"
                         f" the tapped steps' excess {extra:.2f} s = {extra / loop:.1%} of the loop")
            print(line)


if __name__ == "__main__":
    main()
