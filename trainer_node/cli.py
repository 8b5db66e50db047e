"""`trainer-node`: the trainer party's command line.

Each subcommand is ONE function `add_<name>(subparsers)` that declares its parser and sets
`run=<callable(args) -> exit code>`; COMMANDS lists them. To add a subcommand, write its
add_ function (here or in its own module) and append it to COMMANDS.

`simulate` and `bench` belong to the lab (lab/cli.py), which stands apart from the trainer:
this module loads it with importlib only when one of them runs, and hands it the command
line. Without the lab or the owner package (the trainer image) they fail with a message
saying what to install; every other command works.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable
from functools import partial
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


LAB_COMMANDS = {
    "simulate": "the full system on one machine: L2RR + a local target-owner process (the lab)",
    "bench": "compare data policies over matched seeds: paired CIs, RO ratios, the paper's tables (the lab)",
}
LAB_PACKAGES = ("lab", "target_owner_node")


class LabUnavailable(RuntimeError):
    """A lab command in an install without the lab or the owner package."""


def add_lab_command(name: str) -> Callable[[argparse._SubParsersAction], None]:
    """A placeholder parser: its arguments (and --help) are the lab's, parsed once it is loaded."""

    def add(subparsers: argparse._SubParsersAction) -> None:
        parser = subparsers.add_parser(name, help=LAB_COMMANDS[name], add_help=False)
        parser.set_defaults(run=partial(run_lab_command, name), lab_command=name)

    return add


def load_lab_cli(command: str):
    try:
        return importlib.import_module("lab.cli")
    except ImportError as error:
        missing = (error.name or "").split(".")[0]
        if missing not in LAB_PACKAGES:
            raise
        raise LabUnavailable(
            f"`trainer-node {command}` is part of the lab, which needs the `lab` and `target_owner_node` "
            f"packages; this install lacks `{missing}` (a trainer-only install, e.g. the trainer image). "
            "Install the whole project from a checkout of its repository: pip install -e ."
        ) from None


def run_lab_command(name: str, args: argparse.Namespace) -> int:
    return int(load_lab_cli(name).main([name, *args.lab_argv]))


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_train, *(add_lab_command(name) for name in LAB_COMMANDS),
]


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
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "lab_command", None) is None and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.lab_argv = rest
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

    return (ConfigError, CheckpointError, LabUnavailable)


if __name__ == "__main__":
    sys.exit(main())
