"""The protocol conformance suite: runs every check of the target-feedback v1 contract against
a live server and reports PASS / FAIL / SKIP per check.

    from protocol.conformance import run_suite, SuiteOptions
    report = run_suite(SuiteOptions(target="127.0.0.1:50051", ca=..., cert=..., key=...))
    print(report.table()); assert report.passed

Run it against a server that no one else is using: budget checks compare GetBudget before and
after the suite's own calls. The CLI is `feedback-protocol conformance` (protocol/cli.py).
The suite is versioned with the protocol: SUITE_VERSION changes whenever a check is added
or its verdict changes.
"""

from protocol import PROTOCOL_VERSION
from protocol.conformance.options import SuiteOptions, read_canaries, restart_from_command
from protocol.conformance.registry import Check, CheckFailed, CheckSkipped, all_checks, check
from protocol.conformance.runner import SUITE_VERSION, CheckResult, SuiteReport, run_suite, write_json

__all__ = [
    "PROTOCOL_VERSION",
    "SUITE_VERSION",
    "Check",
    "CheckFailed",
    "CheckResult",
    "CheckSkipped",
    "SuiteOptions",
    "SuiteReport",
    "all_checks",
    "check",
    "read_canaries",
    "restart_from_command",
    "run_suite",
    "write_json",
]
