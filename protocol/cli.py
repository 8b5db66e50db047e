"""`feedback-protocol`: tools both parties use with the target-feedback protocol.

    feedback-protocol conformance --target HOST:PORT --ca CA --cert CERT --key KEY [...]

Adding a subcommand: write one `add_<name>(commands)` function that creates its parser and
sets `func` (called with the parsed arguments, returns the exit code), then add one line to
SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from protocol.certs_cli import add_certs_parser


def add_conformance(commands: argparse._SubParsersAction) -> None:
    """`conformance`: run the protocol conformance suite against a live server."""
    from protocol.conformance import command

    parser = commands.add_parser(
        "conformance", help="run the protocol conformance suite against a live server",
        description=command.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_arguments(parser)
    parser.set_defaults(func=command.run)


SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_conformance,
    add_certs_parser,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="feedback-protocol", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
