"""`feedback-protocol conformance`: arguments and the command body (wired up in protocol/cli.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """\
Run the target-feedback v1 conformance suite against a live server and print one row per
check (PASS / FAIL / SKIP). Exits 1 if any check fails, 0 otherwise.

Run it against a server nobody else is using at the time: budget checks compare GetBudget
before and after the suite's own calls, and the suite spends some budget (about 55 releases;
the exhaustion check, only with --allow-exhaust, spends all of it).

Example (an owner's self-test on a fresh node folder):
  feedback-protocol conformance --target 127.0.0.1:50051 --ca node/pki/ca.pem \\
      --cert node/pki/client.pem --key node/pki/client.key --ca-key node/pki/ca.key \\
      --canaries canaries.txt --restart-cmd 'systemctl restart owner-node' --json report.json

--ca-key is the key of the CA that issued --cert. In the two-organization setup of
docs/DEPLOY.md the owner trusts the TRAINER organization's CA for clients, so a trainer (or the
owner, with the trainer organization's help) passes that key: --ca-key trainer/ca/ca.key. A key
of another CA is refused at start; the certificate checks also prove with a valid control
certificate that the server accepts that CA before counting any refusal.

Checks that need an owner on the suite's OWN data (marker rows, one row added or removed,
timing against the secret subsample, deleting the ledger, difference releases whose exact
values or noise the suite knows) run only with --launch-cmd, on
owners the suite starts and stops itself beside the server under test; without it they SKIP.
The template is a shell command serving one owner in the foreground until SIGTERM, reporting
SERVING on grpc.health.v1. Placeholders (filled and shell-quoted by the suite):
  required  {heldout} JSONL rows (id, prompt, answer, verifier)   {port} on 127.0.0.1
            {workdir} empty folder for all its state (reused on relaunch)
            {ca_cert} CA of the suite's client cert (CN trainer)   {server_cert} {server_key}
  optional  {dp} true|false   {sample_rate}   {epsilon}   {planned_releases}
            {owner_options}  the four above as target-owner-node launch flags
--ledger-path names that owner's ledger file, e.g. '{workdir}/storage/privacy_ledger.jsonl'.
This project's owner:
  --launch-cmd 'target-owner-node launch --heldout {heldout} --port {port} --workdir {workdir}
      --ca {ca_cert} --cert {server_cert} --key {server_key} {owner_options}'
  --ledger-path '{workdir}/storage/privacy_ledger.jsonl'
The suite sees only statuses, bytes and latency: not memory, logs, metrics or other ports
(see protocol/conformance/launcher.py for the full contract).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", metavar="HOST:PORT", help="address of the server under test")
    parser.add_argument("--ca", type=Path, metavar="FILE", help="the owner's CA certificate (PEM)")
    parser.add_argument("--cert", type=Path, metavar="FILE", help="a client certificate the server trusts (PEM)")
    parser.add_argument("--key", type=Path, metavar="FILE", help="the client certificate's private key (PEM)")
    parser.add_argument("--server-name", metavar="NAME", help="TLS name to verify when the address is not in the server certificate")
    parser.add_argument("--canaries", type=Path, metavar="FILE",
                        help="strings planted in the held-out prompts/answers, one per line (enables the leak checks)")
    parser.add_argument("--restart-cmd", metavar="CMD",
                        help="shell command that restarts the server (enables the budget-persistence checks)")
    parser.add_argument("--ca-key", type=Path, metavar="FILE",
                        help="the key of the CA that issued --cert: lets the suite mint an expired and a no-clientAuth "
                             "client certificate (and a valid control the server must accept). After "
                             "`target-owner-node init` that is pki/ca.key; in the two-CA setup of docs/DEPLOY.md it "
                             "is the TRAINER organization's ca.key, since the owner trusts that CA for clients")
    parser.add_argument("--rogue-ca-dir", type=Path, metavar="DIR",
                        help="where to write the untrusted CA and certificates (default: a temporary folder)")
    parser.add_argument("--allow-exhaust", action="store_true",
                        help="run the exhaustion check, which spends the server's whole remaining budget")
    parser.add_argument("--only", metavar="ID,...", help="comma-separated check ids (or 'prefix*') to run")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the JSON report here")
    parser.add_argument("--checkpoint", type=Path, metavar="DIR", help="upload this checkpoint instead of a built tiny one")
    parser.add_argument("--noise-releases", type=int, default=30, metavar="R", help="releases for the noise check (default 30)")
    parser.add_argument("--concurrency", type=int, default=8, metavar="N", help="concurrent clients (default 8)")
    parser.add_argument("--fuzz-examples", type=int, default=60, metavar="N", help="fuzzed requests per RPC (default 60)")
    parser.add_argument("--launch-cmd", metavar="TEMPLATE",
                        help="shell command template that starts an owner on the suite's data (see above); enables "
                             "the status, add-one-row, latency, ledger-deletion and difference-release privacy checks")
    parser.add_argument("--ledger-path", metavar="TEMPLATE",
                        help="the launched owner's ledger file, with {workdir} (enables the ledger-deletion check)")
    parser.add_argument("--launch-timeout", type=float, default=180.0, metavar="S",
                        help="seconds a launched owner may take to report SERVING (default 180)")
    parser.add_argument("--status-calls", type=int, default=8, metavar="N",
                        help="evaluations of the status-independence check (default 8)")
    parser.add_argument("--latency-calls", type=int, default=60, metavar="K",
                        help="timed releases of the latency check (default 60, at least 10)")
    parser.add_argument("--difference-noise-releases", type=int, default=32, metavar="K",
                        help="difference releases of the check that their noise is calibrated to the clip "
                             "(default 32, at least 10)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")


def run(args: argparse.Namespace) -> int:
    from protocol.conformance import (
        SuiteOptions,
        all_checks,
        read_canaries,
        restart_from_command,
        run_suite,
        write_json,
    )
    from protocol.conformance.runner import format_row

    if args.list:
        width = max(42, *(len(c.id) for c in all_checks()))
        for c in all_checks():
            print(f"{c.id:<{width}} {c.title}")
        return 0
    missing = [flag for flag, value in (("--target", args.target), ("--ca", args.ca), ("--cert", args.cert),
                                        ("--key", args.key)) if not value]
    if missing:
        print(f"error: {', '.join(missing)} required (see feedback-protocol conformance --help)", file=sys.stderr)
        return 2
    try:
        for flag, path in (("--ca", args.ca), ("--cert", args.cert), ("--key", args.key), ("--ca-key", args.ca_key)):
            if path is not None and not path.is_file():
                raise ValueError(f"{flag}: no such file {path}")
        if args.ca_key is not None:
            from protocol.conformance.pki import client_ca

            client_ca(args.cert.read_bytes(), args.ca_key.read_bytes())  # a key of the wrong CA: a usage error
        options = SuiteOptions(
            target=args.target, ca=args.ca, cert=args.cert, key=args.key, server_name=args.server_name,
            canaries=read_canaries(args.canaries) if args.canaries else [],
            restart=restart_from_command(args.restart_cmd) if args.restart_cmd else None,
            ca_key=args.ca_key, rogue_ca_dir=args.rogue_ca_dir, allow_exhaust=args.allow_exhaust,
            only=[item.strip() for item in args.only.split(",") if item.strip()] if args.only else None,
            checkpoint_dir=args.checkpoint, noise_releases=args.noise_releases, concurrency=args.concurrency,
            fuzz_examples=args.fuzz_examples, launch_cmd=args.launch_cmd, ledger_path=args.ledger_path,
            launch_timeout_s=args.launch_timeout, status_calls=args.status_calls, latency_calls=args.latency_calls,
            difference_noise_releases=args.difference_noise_releases,
        )
        from protocol.conformance.registry import select_checks

        select_checks(options.only)  # unknown ids: a usage error before anything runs
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    print(f"conformance suite against {args.target}", flush=True)
    report = run_suite(options, on_result=lambda result: print(format_row(result), flush=True))
    counts = report.counts()
    print(f"{len(report.results)} checks: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
          f"in {report.seconds:.1f} s (suite {report.suite_version}, protocol {report.protocol_version})")
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    return 0 if report.passed else 1
