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
        help="GRPO on your source prompts with a data policy; with [feedback], guided by a target owner",
        description=(
            "Run GRPO on the source prompts (a testbed, or your own [data.prompts]) with the data\n"
            "policy named in the config, on the tiny policy or your own model folder ([model] path).\n"
            "Without a [feedback] section no target owner is contacted. With one, train is the\n"
            "owner's client: it first checks the owner (certificate files, TLS handshake, GetInfo,\n"
            "GetBudget) and exits non-zero at once, naming the setting to fix, when the owner is\n"
            "misconfigured, refuses it or (feedback.required = true, the default) is unreachable;\n"
            "it renders prompts as the owner publishes and uploads checkpoints for its feedback. A\n"
            "privacy budget that runs out mid-run stops feedback, not training. Progress is measured\n"
            "on a held-out slice of the source. Writes metrics.jsonl, summary.json, PNG plots,\n"
            "resolved_config.json and checkpoints/step_N/ under the run directory."
        ),
        epilog=(
            "example:\n  trainer-node train --steps 20 --out runs/demo   # packaged default config\n"
            "  trainer-node train --config my.toml --resume runs/demo   # continue from its newest checkpoint\n"
            "  trainer-node check-owner --config my.toml                # the [feedback] owner answers?\n"
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


def add_check_owner(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check-owner",
        help="connect to the [feedback] owner(s): print each task card and budget, exit 0 (all ok) or 1",
        description=(
            "Check the target owner of a config's [feedback] section the way `train` does at start:\n"
            "the certificate files, a TLS handshake with them (a wrong CA, server name or client\n"
            "certificate is named as such), then GetInfo and GetBudget. Prints the owner's public\n"
            "task card and privacy budget. Spends nothing. Exit 0 when the owner answers, 1 when not.\n"
            "With several owners ([[feedback.owners]]) each is checked and reported under its name;\n"
            "exit 0 only when every one answers."
        ),
        epilog="example:\n  trainer-node check-owner --config my_run.toml   # a run config, or a file with only [feedback]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, required=True,
                        help="a TOML file with a [feedback] section (a run config, or only that section)")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="S",
                        help="seconds to wait for the TCP connection and the TLS handshake (default 5)")
    parser.set_defaults(run=run_check_owner)


def run_check_owner(args: argparse.Namespace) -> int:
    from trainer_node.config import OwnerEntry, load_feedback_section
    from trainer_node.feedback.client import FeedbackError
    from trainer_node.feedback.preflight import check_owner, describe_owner, located

    try:
        feedback = load_feedback_section(args.config)
    except ConfigError as error:
        print(f"trainer-node check-owner: error: {error}", file=sys.stderr)
        return 1
    entries = feedback.owner_entries()
    failed = 0
    for where, owner in entries:
        label = f"{owner.name} ({where}): " if isinstance(owner, OwnerEntry) else ""
        try:
            status = check_owner(feedback.client_settings_for(owner), timeout_s=args.timeout)
        except FeedbackError as error:
            failed += 1
            print(f"trainer-node check-owner: error: {label}{located(error, where)}", file=sys.stderr)
            continue
        print(f"{label}connected to {owner.target}")
        for line in describe_owner(status):
            print(f"  {line}" if label else line)
    if len(entries) > 1:
        print(f"{len(entries) - failed} of {len(entries)} owners answered")
    return 1 if failed else 0


LAB_COMMANDS = {
    "simulate": "the full system on one machine: L2RR + a local target-owner process (the lab)",
    "bench": "compare data policies over matched seeds: paired CIs, RO ratios, the paper's tables (the lab)",
    "testbed": "generate testbeds where target feedback matters: wrong-label source copies (the lab)",
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
    add_train, add_check_owner, *(add_lab_command(name) for name in LAB_COMMANDS),
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
        # Config, checkpoint and owner problems are the user's to fix: one clear message naming the
        # setting, no traceback, exit 2.
        print(f"trainer-node: error: {error}", file=sys.stderr)
        return 2


def _user_errors() -> tuple[type[Exception], ...]:
    from trainer_node.feedback.preflight import OwnerStartError
    from trainer_node.grpo.checkpoint import CheckpointError

    # OwnerStartError: the [feedback] owner cannot be used as configured (it names the setting).
    return (ConfigError, CheckpointError, LabUnavailable, OwnerStartError)


if __name__ == "__main__":
    sys.exit(main())
