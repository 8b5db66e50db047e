"""The lab's subcommands, `simulate` and `bench`, as `trainer-node` shows them.

trainer_node/cli.py loads this module lazily (importlib), only for those two subcommands, and
hands it the command line; `python -m lab.cli simulate ...` works as well. Importing it fails
with ModuleNotFoundError naming `target_owner_node` when the owner package is not installed:
the trainer's CLI turns that into a message saying what to install.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import target_owner_node  # noqa: F401  the lab drives an owner: fail at once, and clearly, without one
from lab.bench.cli import add_bench_parser
from lab.simulate import SIMULATION_EPSILON, TARGET_MIX, SimulateOptions, run_simulation
from trainer_node.policies.base import policy_names

DESCRIPTION = """\
Run the whole two-party system on this machine, on embedded defaults:

  1. build (or reuse from .cache/) the tiny policy from the testbed's SOURCE data;
  2. an owner setup (the owner's own `init`, fresh mTLS certificates), then
     `target-owner-node serve` as a separate process on a free loopback port;
     only that process serves the target data;
  3. GRPO with the chosen data policy (L2RR by default), which learns from the owner's
     aggregate, differentially private held-out accuracy;
  4. a summary: target TEST accuracy before/after (measured by the owner process),
     rollouts spent, epsilon spent out of the budget, wall time.

The run directory gets metrics.jsonl, summary.json, resolved_config.json and PNG plots
(accuracy vs rollouts, q per cluster over training, training reward)."""

EPILOG = """\
examples:
  trainer-node simulate                                   # L2RR on the default testbed
  trainer-node simulate --method uniform --seed 1         # a baseline, another seed
  trainer-node simulate --method dapo --steps 20 --out runs/dapo
  trainer-node simulate --no-dp                           # exact releases (no DP noise)
  trainer-node simulate --config my.toml                  # your own config instead of the defaults
methods: uniform, dapo, greso, ar3po, l2rr (trainer_node/policies/); diagnostics that only a
  simulation can run: oracle (lab/policies/: source domains in the target's composition) and
  target_mix (uniform GRPO that also trains on the owner's feedback split)
checkpoint selection by target feedback (any method): set [selection] every = K in --config
defaults: lab/configs/simulate_default.toml"""


def add_simulate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate", help="the full system on one machine: L2RR + a local target-owner process",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--method", help="data policy or diagnostic (default: l2rr; see the list below)")
    parser.add_argument("--testbed", help="testbed name (built-in: default, arith, strings, small) or a testbed TOML path (default: default)")
    parser.add_argument("--seed", type=int, help="run seed (default 0)")
    parser.add_argument("--steps", type=int, help="GRPO steps (default 60)")
    parser.add_argument("--out", type=Path, help="run directory (default runs/simulate)")
    parser.add_argument("--no-dp", action="store_true", help="the owner releases exact accuracy (no DP)")
    parser.add_argument("--epsilon", type=float, default=SIMULATION_EPSILON,
                        help="the owner's total privacy budget (default %(default)s)")
    parser.add_argument("--config", type=Path,
                        help="a TOML run config used instead of the embedded defaults (flags still apply)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(run=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    known = [*policy_names(), TARGET_MIX]
    if args.method is not None and args.method not in known:
        raise SystemExit(f"trainer-node simulate: --method {args.method!r} is unknown; choose one of: {', '.join(known)}")

    run_simulation(
        SimulateOptions(
            method=args.method, testbed=args.testbed, seed=args.seed, steps=args.steps, out=args.out,
            no_dp=args.no_dp, config=args.config, epsilon=args.epsilon, progress=not args.no_progress,
        )
    )
    return 0


COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "simulate": add_simulate,
    "bench": add_bench_parser,
}


def build_parser() -> argparse.ArgumentParser:
    """The lab's parser; its prog is `trainer-node`, the command users type."""
    parser = argparse.ArgumentParser(prog="trainer-node", description="The lab: simulation and benchmarks.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in COMMANDS.values():
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args))
    except Exception as error:
        if not isinstance(error, _user_errors()):
            raise
        # Config, checkpoint and owner-process problems are the user's to fix: one message, no traceback.
        print(f"trainer-node: error: {error}", file=sys.stderr)
        return 2


def _user_errors() -> tuple[type[Exception], ...]:
    from lab.owner_process import OwnerProcessError
    from trainer_node.config import ConfigError
    from trainer_node.grpo.checkpoint import CheckpointError

    return (ConfigError, CheckpointError, OwnerProcessError)


if __name__ == "__main__":
    sys.exit(main())
