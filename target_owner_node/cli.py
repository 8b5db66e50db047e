"""`target-owner-node`: set up, run and audit a target-owner node.

target-owner-node init DIR                 # config, certificates, held-out + test data
target-owner-node serve --config DIR/config.toml
target-owner-node audit verify --config DIR/config.toml
target-owner-node ledger verify|rebuild|carry-forward --config DIR/config.toml
target-owner-node launch --heldout F --port P --workdir DIR --ca F --cert F --key F   # for the suite
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

DESCRIPTION = """\
Run the target owner's side of target-feedback GRPO.

The owner keeps a private held-out set and a verifier. A trainer uploads checkpoints
(safetensors only) over mutual TLS and asks for their accuracy; the node answers with
aggregate accuracy only, with differential-privacy noise and a hard epsilon budget that
is written to disk before any number leaves the machine.

Typical first run:
  target-owner-node init mynode                 # writes mynode/config.toml, pki/, data
  target-owner-node serve --config mynode/config.toml
  # a rehearsal on one machine: the trainer uses mynode/pki/ca.pem, client.pem, client.key;
  # across two organizations each makes its own CA and only ca.pem files cross (docs/DEPLOY.md)
  target-owner-node audit verify --config mynode/config.toml

If the privacy ledger is lost, the node refuses to start; rebuild it from the audit log:
  target-owner-node ledger verify  --config mynode/config.toml
  target-owner-node ledger rebuild --config mynode/config.toml
If storage.dir was restored from an older backup, the node refuses to start (the state marker outside
it has seen more charges); charge the lost releases again, audited, and start:
  target-owner-node ledger carry-forward --config mynode/config.toml --reason "restored from backup"
"""

LAUNCH_DESCRIPTION = """Serve one held-out file on one port, in the foreground, exactly like `serve`: the owner's
implementation of the conformance suite's --launch-cmd contract (the suite fills in the
held-out file and the port, and brings its own PKI), e.g.

  feedback-protocol conformance ... --launch-cmd \
    "target-owner-node launch --heldout {heldout} --port {port} --workdir W --ca CA --cert C --key K"

Writes DIR/config.toml from these options (rewritten at every launch: test split off,
min_heldout_size = min(100, rows), storage in DIR/storage, kept between launches so a
relaunch resumes the same ledger), then prints 'listening on 127.0.0.1:PORT' once ready.
SIGTERM/SIGINT: health turns NOT_SERVING, in-flight calls finish, exit 0.
"""


def build_parser() -> argparse.ArgumentParser:
    from rlvr_core.configuration import default_of
    from target_owner_node.config import EvaluationConfig, PrivacyConfig

    # Every default is the config model's (one definition); the flags only relay it.
    epsilon = default_of(PrivacyConfig, "epsilon_budget")
    sample_rate = default_of(PrivacyConfig, "sample_rate")
    planned_releases = default_of(PrivacyConfig, "planned_releases")
    prompt_tokens = default_of(EvaluationConfig, "max_prompt_tokens")
    parser = argparse.ArgumentParser(
        prog="target-owner-node",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = commands.add_parser(
        "init",
        help="create a node folder: config.toml, certificates, held-out and test data",
        description="Create DIR/config.toml, DIR/pki/ (owner CA, server and trainer certificates), "
        "DIR/heldout.jsonl (the testbed's feedback split), DIR/test.jsonl and DIR/storage/. "
        "Edit config.toml afterwards to point at your own held-out data.",
    )
    init.add_argument("dir", type=Path, metavar="DIR", help="folder to create (must not hold a config.toml)")
    init.add_argument(
        "--testbed", default=None, help="testbed whose splits become the data (default: the project default)"
    )
    init.add_argument(
        "--server-name",
        action="append",
        dest="server_names",
        metavar="NAME",
        help="DNS name or IP the trainer will dial; repeat for several (default: localhost and 127.0.0.1)",
    )
    init.add_argument(
        "--client-name", default="trainer", help="common name of the trainer's client certificate"
    )
    init.add_argument("--epsilon", type=float, default=epsilon,
                      help="total privacy budget epsilon (default %(default)s)")
    init.add_argument("--sample-rate", type=float, default=sample_rate,
                      help="Poisson subsampling rate q of each release (default %(default)s; 1 = every row)")
    init.add_argument("--planned-releases", type=int, default=planned_releases,
                      help="single-candidate releases the budget must cover; sets the noise "
                           "(default %(default)s)")
    init.add_argument("--no-dp", action="store_true", help="release exact accuracy (no privacy guarantee)")
    init.add_argument("--max-prompt-tokens", type=int, default=prompt_tokens, metavar="N",
                      help="the PUBLIC prompt width: every held-out prompt is left-padded or cut to N tokens, so "
                           "evaluation time never depends on which rows were drawn (default %(default)s; "
                           "choose it from "
                           "the task card, not from the held-out rows)")
    init.add_argument(
        "--enable-test-split",
        action="store_true",
        help="serve SPLIT_TEST (exact accuracy, NO privacy guarantee): for simulation and benchmarks only",
    )
    init.add_argument(
        "--canary-file",
        type=Path,
        metavar="F",
        help="plant each line of F into a held-out prompt and answer (for leak/conformance tests)",
    )

    serve = commands.add_parser(
        "serve",
        help="run the gRPC server (mTLS) until SIGTERM/SIGINT",
        description="Validate the config and data, replay the privacy ledger, then serve. Prints "
        "'listening on HOST:PORT' on stdout once ready; logs JSON lines (never data) on stderr. "
        "SIGTERM/SIGINT: health turns NOT_SERVING, in-flight calls finish, exit 0.",
    )
    serve.add_argument("--config", type=Path, required=True, help="the node's config.toml")
    serve.add_argument(
        "--port", type=int, default=None, help="override the port of server.listen_address (0 = any free)"
    )
    serve.add_argument(
        "--insecure-noise-seed", type=int, default=None, metavar="N",
        help="SIMULATIONS ONLY, NO PRIVACY: draw each release's subsample and DP noise from N and the request's "
        "content, so a simulated run reproduces exactly; anyone who knows N can subtract the noise "
        "(`trainer-node simulate` passes its run seed; never use it on real data)",
    )

    audit = commands.add_parser("audit", help="inspect the hash-chained audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    verify = audit_commands.add_parser(
        "verify",
        help="check the audit chain",
        description="Recompute every hash of the audit log. Prints "
        "'OK <n> entries' or the first line that breaks the chain (exit 1).",
    )
    source = verify.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="the node's config.toml (log = storage.dir/audit.jsonl)")
    source.add_argument("--log", type=Path, help="path of an audit log")

    ledger = commands.add_parser("ledger", help="check the privacy ledger against the audit log, or rebuild it")
    ledger_commands = ledger.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    ledger_verify = ledger_commands.add_parser(
        "verify",
        help="compare the ledger's charges with the audit log's",
        description="Run the start-up cross-check: the ledger and the audit log must record the same charges "
        "(release ids, clients, DP events) and the same released values. Prints the result; exit 0 when the "
        "node would start (a last charge left unaudited by a crash is allowed: the next start records it), "
        "1 otherwise.",
    )
    ledger_verify.add_argument("--config", type=Path, required=True, help="the node's config.toml")
    rebuild = ledger_commands.add_parser(
        "rebuild",
        help="rebuild a lost ledger from the audit log (stop the node first)",
        description="Write storage.dir/privacy_ledger.jsonl from the audit log's charges, so the spend is "
        "exact, and its released values, so a retry of a completed request_id replays them. A release that was "
        "charged but never completed cannot be resumed (its secret subsample and noise are not audited): its "
        "retry is refused. The rebuild is recorded in the audit log ('ledger_rebuilt'). Stop the node first.",
    )
    rebuild.add_argument("--config", type=Path, required=True, help="the node's config.toml")
    rebuild.add_argument(
        "--force",
        action="store_true",
        help="rebuild although a ledger exists: the old one is renamed aside (never deleted)",
    )

    carry = ledger_commands.add_parser(
        "carry-forward",
        help="after restoring storage.dir from a backup: charge the releases it lacks again (stop the node first)",
        description="A backup of storage.dir is older than the releases made since it was taken; started as it is, "
        "the node would count less spend than it released, so it refuses (the state marker outside storage.dir "
        "keeps the high-water mark of every charge). This charges every DP event the marker counted beyond the "
        "ledger again (ledger entries marked recovered, with their audit entries), then audits one "
        "'spend_carried_forward' entry with the counts, the epsilon before and after, and --reason. The lost "
        "releases' clients and values cannot be restored (a retry of their request_id is a new release). The "
        "ledger and the audit log must agree first (ledger verify). Stop the node first.",
    )
    carry.add_argument("--config", type=Path, required=True, help="the node's config.toml")
    carry.add_argument("--reason", required=True, help="why storage.dir was restored (written to the audit log)")

    launch = commands.add_parser(
        "launch",
        help="serve one held-out file on one port (the conformance suite's --launch-cmd)",
        description=LAUNCH_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    launch.add_argument("--heldout", type=Path, required=True, metavar="FILE", help="JSONL/parquet held-out rows")
    launch.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0 = any free port)")
    launch.add_argument("--workdir", type=Path, required=True, metavar="DIR", help="config.toml and storage/ go here")
    launch.add_argument("--ca", type=Path, required=True, help="PEM of the CA that signs the client certificates")
    launch.add_argument("--cert", type=Path, required=True, help="PEM server certificate")
    launch.add_argument("--key", type=Path, required=True, help="PEM private key of --cert")
    launch.add_argument("--no-dp", action="store_true", help="release exact accuracy (no privacy guarantee)")
    launch.add_argument("--sample-rate", type=float, default=sample_rate,
                        help="Poisson sampling rate q (default %(default)s)")
    launch.add_argument("--epsilon", type=float, default=epsilon,
                        help="total privacy budget epsilon (default %(default)s)")
    launch.add_argument("--planned-releases", type=int, default=planned_releases,
                        help="single-candidate releases the budget must cover (default %(default)s)")
    launch.add_argument("--verifier", default="per_example",
                        help="'per_example' (each row names its verifier) or one verifier for every row")
    launch.add_argument("--prompt-template", default=None, metavar="T",
                        help="how each prompt is rendered; contains {prompt} once (default: the project's)")
    return parser


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def cmd_init(args: argparse.Namespace) -> int:
    from target_owner_node.scaffold import init_node

    canaries = None
    if args.canary_file is not None:
        canaries = [
            line.strip() for line in args.canary_file.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    try:
        result = init_node(
            args.dir,
            testbed=args.testbed,
            server_names=args.server_names,
            client_name=args.client_name,
            epsilon=args.epsilon,
            dp_enabled=not args.no_dp,
            sample_rate=args.sample_rate,
            planned_releases=args.planned_releases,
            canaries=canaries,
            test_split_enabled=args.enable_test_split,
            max_prompt_tokens=args.max_prompt_tokens,
        )
    except (FileExistsError, ValueError, KeyError) as error:
        return _fail(str(error))
    print(f"wrote {result.config_path}")
    print(f"wrote {result.heldout_path} (private held-out feedback split)")
    served = "served: exact, NO privacy guarantee" if args.enable_test_split else "not served: --enable-test-split"
    print(f"wrote {result.test_path} (test split, {served})")
    for name, path in sorted(result.owner_files.items()):
        print(
            f"wrote {path} ({name}, keep on this machine)" if name != "ca_cert" else f"wrote {path} ({name})"
        )
    print("for a rehearsal on ONE machine, the trainer uses these files (init made its key here):")
    for name, path in sorted(result.trainer_files.items()):
        print(f"  {path}  ({name})")
    print("across two organizations no private key crosses: the trainer makes its own CA and key, and the two")
    print("organizations exchange only their ca.pem files; delete pki/ (docs/DEPLOY.md, Step by step)")
    print(f"then run: target-owner-node serve --config {result.config_path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    return serve(args.config, args.port, args.insecure_noise_seed)


def cmd_launch(args: argparse.Namespace) -> int:
    from target_owner_node.heldout import HeldoutError
    from target_owner_node.launch import LaunchOptions, write_launch_config

    options = LaunchOptions(
        heldout=args.heldout, port=args.port, workdir=args.workdir, ca=args.ca, cert=args.cert, key=args.key,
        dp=not args.no_dp, sample_rate=args.sample_rate, epsilon=args.epsilon,
        planned_releases=args.planned_releases, verifier=args.verifier, prompt_template=args.prompt_template,
    )
    try:
        config_path = write_launch_config(options)
    except (HeldoutError, OSError) as error:
        return _fail(str(error))
    return serve(config_path, args.port)


def _noise_source(insecure_noise_seed: int | None):
    """None (the node's secure OS randomness) unless a simulation asked for reproducible noise."""
    if insecure_noise_seed is None:
        return None
    from protocol.privacy.mechanisms import ContentSeededRandom

    print("WARNING: --insecure-noise-seed: releases carry noise anyone who knows the seed can subtract; "
          "this owner gives NO privacy (simulations only)", file=sys.stderr, flush=True)
    return ContentSeededRandom(insecure_noise_seed)


def serve(config_path: Path, port_override: int | None = None, insecure_noise_seed: int | None = None) -> int:
    """Start the node of `config_path` and serve until SIGTERM/SIGINT (`serve` and `launch`)."""
    from target_owner_node.config import ConfigError, load_config, split_address
    from target_owner_node.node import NodeStartupError
    from target_owner_node.server import start_server

    try:
        config = load_config(config_path)
        host, port = split_address(config.server.listen_address)
        if port_override is not None:
            port = port_override
        display_host = f"[{host}]" if ":" in host else host
        running = start_server(config, f"{display_host}:{port}", random_source=_noise_source(insecure_noise_seed))
    except (ConfigError, NodeStartupError, ValueError) as error:
        return _fail(str(error))
    except RuntimeError as error:  # grpc reports a failed bind as RuntimeError
        return _fail(f"could not listen on {config.server.listen_address}: {error}")

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(f"listening on {display_host}:{running.port}", flush=True)
    threading.Thread(target=_warm_worker, args=(running,), daemon=True).start()
    while not stop.wait(0.5):
        pass
    running.shutdown()
    return 0


def _warm_worker(running) -> None:
    """Start the evaluation worker in the background so the first Evaluate is not slow."""
    start = getattr(running.node.scorer, "start", None)
    if start is None:
        return
    try:
        start()
    except Exception:  # noqa: BLE001, S110 - logged by the scorer; evaluation will retry the start
        pass


def cmd_audit_verify(args: argparse.Namespace) -> int:
    from target_owner_node.audit import verify_chain
    from target_owner_node.config import ConfigError, load_config
    from target_owner_node.node import audit_path

    if args.log is not None:
        path = args.log
    else:
        try:
            path = audit_path(load_config(args.config))
        except ConfigError as error:
            return _fail(str(error))
    if not path.exists():
        print(f"OK 0 entries ({path} does not exist yet)")
        return 0
    ok, count, bad_line = verify_chain(path)
    if ok:
        print(f"OK {count} entries verified in {path}")
        return 0
    print(f"FAILED: {path} line {bad_line} breaks the hash chain ({count} entries before it verified)")
    return 1


def cmd_ledger(args: argparse.Namespace) -> int:
    from target_owner_node.audit import AuditChainError, AuditLog
    from target_owner_node.config import ConfigError, load_config
    from target_owner_node.ledger import Ledger, LedgerCorruptError
    from target_owner_node.ledger_audit import AuditRecordError, check_consistency, rebuild_ledger
    from target_owner_node.node import audit_path, ledger_path

    try:
        config = load_config(args.config)
        audit = AuditLog(audit_path(config))  # verifies the chain
        if args.ledger_command == "carry-forward":
            from target_owner_node.carry_forward import carry_forward

            carried = carry_forward(config, Ledger(ledger_path(config)), audit, args.reason)
            print(f"carried {carried.carried} releases forward: epsilon {carried.epsilon_before:.4f} -> "
                  f"{carried.epsilon_after:.4f} (the state marker's high-water mark: {carried.high_water_epsilon:.4f})"
                  if carried.carried else "nothing to carry forward: the ledger holds every charge the marker saw")
        if args.ledger_command == "rebuild":
            result = rebuild_ledger(ledger_path(config), audit, force=args.force)
            if result.moved_aside is not None:
                print(f"moved the previous ledger to {result.moved_aside} (kept)")
            print(
                f"rebuilt {result.ledger_path} from {audit.path}: {result.charges} charges, {result.completed} "
                f"completed (a retry replays their values), {result.unfinished} unfinished (a retry is refused)"
            )
        consistency = check_consistency(Ledger(ledger_path(config)), audit.path)
    except (ConfigError, AuditChainError, LedgerCorruptError, AuditRecordError, FileExistsError, ValueError) as error:
        return _fail(str(error))
    print(("OK " if consistency.ok else "FAILED: ") + consistency.describe())
    if not consistency.ok:
        print(f"recover with: target-owner-node ledger rebuild --config {args.config} [--force]")
    return 0 if consistency.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {
        "init": cmd_init,
        "serve": cmd_serve,
        "audit": cmd_audit_verify,
        "ledger": cmd_ledger,
        "launch": cmd_launch,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
