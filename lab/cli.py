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

import target_owner_node  # noqa: F401  the lab drives an owner: fail at once, and clearly, without one
from lab.bench.cli import add_bench_parser
from lab.simulate_cli import add_simulate
from lab.testbeds import add_testbed_parser

COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "simulate": add_simulate,
    "bench": add_bench_parser,
    "testbed": add_testbed_parser,
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
