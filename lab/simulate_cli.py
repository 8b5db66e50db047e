"""`trainer-node simulate`: argument parsing for lab/simulate.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.simulate import SIMULATION_EPSILON, SimulateOptions, method_names, run_simulation

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
  trainer-node simulate --owners 3 --testbed dataflex     # three owners (math, logic, text) over Flower
methods: uniform, dapo, greso, ar3po, l2rr, and DataFlex-RL's mixtures static, reward_gap,
  dump_ucb, tscl (trainer_node/policies/); DataFlex-RL's selection rules difffilter, maxvar,
  gfpo, topk and reweighting rules ar, per, softmax, diffband, each on uniform sampling
  (trainer_node/grpo/update_rules/; docs/DATAFLEX.md); diagnostics that only a simulation can
  run: oracle (lab/policies/: source domains in the target's composition) and target_mix
  (uniform GRPO that also trains on the owner's feedback split)
checkpoint selection by target feedback (any method): set [selection] every = K in --config
a noisy owner grader on the feedback split L2RR learns from (the test split stays exact): set
  [simulated_owner] feedback_verifier = { name = "noisy_flip", flip_rate = 0.2 } in --config
the local owner runs at nice 19, on CPU the trainer leaves idle, as an owner on its own machine
  would; [simulated_owner] nice = 0 shares the cores on equal terms, and scheduler = "idle"
  runs it under SCHED_IDLE
defaults: lab/configs/simulate_default.toml"""


def add_simulate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate", help="the full system on one machine: L2RR + a local target-owner process",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--method", help="data policy or diagnostic (default: l2rr; see the list below)")
    from rlvr_core.tasks.testbed import testbed_names

    parser.add_argument("--testbed", help=f"testbed name (built-in: {', '.join(testbed_names())}) or a testbed TOML "
                        "path (default: default)")
    parser.add_argument("--seed", type=int, help="run seed (default 0)")
    parser.add_argument("--steps", type=int, help="GRPO steps (default 60)")
    parser.add_argument("--out", type=Path, help="run directory (default runs/simulate)")
    parser.add_argument("--no-dp", action="store_true", help="the owner releases exact accuracy (no DP)")
    parser.add_argument("--epsilon", type=float, default=SIMULATION_EPSILON,
                        help="the owner's total privacy budget (default %(default)s)")
    parser.add_argument("--config", type=Path,
                        help="a TOML run config used instead of the embedded defaults (flags still apply)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--owners", type=int, default=1,
                        help="N > 1: N target owners, each with its own target domain and owner process, over "
                             "Flower's simulation runtime (the federation extra; docs/FLOWER.md). Default 1: one "
                             "owner over direct gRPC")
    parser.add_argument("--aggregation", help="with --owners: how the owners' releases combine (heldout_size, "
                                              "mixture from [owners] in --config, per_owner)")
    parser.add_argument("--learn-from", metavar="OWNER",
                        help="with --owners: L2RR learns against this owner's target only (owner0, owner1, ...)")
    parser.set_defaults(run=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    known = method_names()
    if args.method is not None and args.method not in known:
        raise SystemExit(f"trainer-node simulate: --method {args.method!r} is unknown; choose one of: {', '.join(known)}")

    options = SimulateOptions(
        method=args.method, testbed=args.testbed, seed=args.seed, steps=args.steps, out=args.out,
        no_dp=args.no_dp, config=args.config, progress=not args.no_progress,
        # None: the simulation's own default (SimulateOptions.epsilon)
        **({} if args.epsilon is None else {"epsilon": args.epsilon}),
    )
    if args.owners < 1:
        raise SystemExit("trainer-node simulate: --owners must be at least 1")
    if args.owners == 1:
        if args.aggregation or args.learn_from:
            raise SystemExit("trainer-node simulate: --aggregation and --learn-from need --owners N with N > 1")
        run_simulation(options)
        return 0
    from lab.federation import FederatedOptions, run_federated_simulation

    run_federated_simulation(options, FederatedOptions(owners=args.owners, aggregation_name=args.aggregation,
                                                       learn_from=args.learn_from))
    return 0
