"""`trainer-node`: the trainer party's command line.

Each subcommand is ONE function `add_<name>(subparsers)` that declares its parser and sets
`run=<callable(args) -> exit code>`; COMMANDS lists them. To add a subcommand, write its
add_ function (here or in its own module) and append it to COMMANDS.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from trainer_node.config import ConfigError, load_config

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "train_default.toml"


def add_train(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="GRPO on the source data with a data policy (no target feedback)",
        description=(
            "Run GRPO on the testbed's source split with the data policy named in the config.\n"
            "No target owner is contacted: progress is measured on a held-out slice of the\n"
            "source data. Writes metrics.jsonl, summary.json, PNG plots, resolved_config.json\n"
            "and checkpoints/step_N/ under the run directory."
        ),
        epilog=(
            "example:\n  trainer-node train --steps 20 --out runs/demo   # packaged default config\n"
            "  trainer-node train --config my.toml --resume runs/demo   # continue from its newest checkpoint\n"
            "config reference: trainer_node/configs/train_default.toml (every key, with comments)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="TOML run config (default: the packaged train_default.toml)")
    parser.add_argument("--steps", type=int, help="override run.steps (total steps, counting resumed ones)")
    parser.add_argument("--out", type=Path, help="override run.out_dir (the run directory)")
    parser.add_argument("--seed", type=int, help="override run.seed")
    parser.add_argument("--resume", type=Path, metavar="DIR",
                        help="a run directory or checkpoints/step_N directory to continue from; "
                             "the run directory defaults to the resumed one")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    parser.set_defaults(run=run_train)


def run_train(args: argparse.Namespace) -> int:
    from trainer_node.grpo.checkpoint import latest_checkpoint
    from trainer_node.training import run_training

    out = args.out
    if args.resume is not None and out is None:
        out = latest_checkpoint(args.resume).parent.parent  # run_dir/checkpoints/step_N
    config = load_config(args.config, {"run.steps": args.steps, "run.out_dir": out and str(out), "run.seed": args.seed})
    run_training(config, resume=args.resume, progress=not args.no_progress)
    return 0


from trainer_node.bench import add_bench_parser
from trainer_node.simulate_cli import add_simulate

COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_train, add_simulate, add_bench_parser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainer-node",
        description="The trainer party: GRPO with a pluggable data policy, optionally guided by "
                    "aggregate feedback from a target owner.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in COMMANDS:
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
        # Config and checkpoint problems are the user's to fix: one clear message, no traceback.
        print(f"trainer-node: error: {error}", file=sys.stderr)
        return 2


def _user_errors() -> tuple[type[Exception], ...]:
    from trainer_node.grpo.checkpoint import CheckpointError
    from trainer_node.owner_process import OwnerProcessError

    return (ConfigError, CheckpointError, OwnerProcessError)


if __name__ == "__main__":
    sys.exit(main())
