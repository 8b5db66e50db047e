"""The lab: simulation, benchmarks, owner-process management and simulation-only policies.

It stands apart from the two parties it drives: it may import both `trainer_node` and
`target_owner_node`, and neither imports it (tests/test_import_rules.py). The trainer's CLI
loads it lazily, only for `trainer-node simulate` and `trainer-node bench`.

    lab/simulate.py        one simulated two-party run (the trainer's run loop + an owner process)
    lab/owner_process.py   `target-owner-node serve` as a child process; owner setup in-process
    lab/evaluation.py      evaluation hooks on the target's test split (simulation only)
    lab/policies/          simulation-only data policies (oracle)
    lab/bench/             matched-seed comparisons of data policies (`trainer-node bench`)
    lab/cli.py             the `simulate` and `bench` subcommands (simulate_cli.py, bench/cli.py)
"""

import lab.policies  # noqa: F401  registers the simulation-only policies before any lab code names one
