"""Run the registered checks against a live server and report: a table and a JSON document."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import grpc

from protocol import PROTOCOL_VERSION
from protocol.conformance.context import SuiteContext
from protocol.conformance.options import SuiteOptions
from protocol.conformance.recorder import describe_failure
from protocol.conformance.registry import Check, CheckFailed, CheckSkipped, select_checks

SUITE_VERSION = "1.1"
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclass(frozen=True)
class CheckResult:
    id: str
    title: str
    result: str          # PASS / FAIL / SKIP
    rationale: str       # why the property matters and how it is judged
    detail: str          # what was observed (the failure or the skip reason)
    seconds: float


@dataclass
class SuiteReport:
    target: str
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    started_at: str = ""
    protocol_version: str = PROTOCOL_VERSION
    suite_version: str = SUITE_VERSION

    @property
    def passed(self) -> bool:
        """True when no check failed (skips do not fail a run)."""
        return all(r.result != FAIL for r in self.results)

    def by_id(self) -> dict[str, CheckResult]:
        return {r.id: r for r in self.results}

    def counts(self) -> dict[str, int]:
        return {kind: sum(r.result == kind for r in self.results) for kind in (PASS, FAIL, SKIP)}

    def to_json(self) -> dict:
        return {
            "protocol_version": self.protocol_version,
            "suite_version": self.suite_version,
            "target": self.target,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 3),
            "summary": self.counts(),
            "checks": [asdict(r) | {"seconds": round(r.seconds, 3)} for r in self.results],
        }

    def table(self, width: int = 110) -> str:
        id_width = max([len(r.id) for r in self.results] + [5])
        lines = [f"{'check':<{id_width}}  result  detail", "-" * min(width + id_width, 160)]
        lines += [format_row(r, id_width, width) for r in self.results]
        counts = self.counts()
        lines.append(
            f"{len(self.results)} checks: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped "
            f"in {self.seconds:.1f} s (suite {self.suite_version}, protocol {self.protocol_version})"
        )
        return "\n".join(lines)


def format_row(result: CheckResult, id_width: int = 40, width: int = 110) -> str:
    text = result.detail if result.result != PASS or result.detail else result.title
    text = " ".join(text.split())
    if len(text) > width:
        text = text[: width - 3] + "..."
    return f"{result.id:<{id_width}}  {result.result:<6}  {text}"


def run_suite(options: SuiteOptions, on_result: Callable[[CheckResult], None] | None = None) -> SuiteReport:
    """Run the selected checks (options.only, default all) in order; never raises for a
    server fault: each fault becomes a FAIL in the report."""
    checks = select_checks(options.only)
    report = SuiteReport(target=options.target, started_at=datetime.now(UTC).isoformat(timespec="seconds"))
    started = time.monotonic()
    context = SuiteContext(options)
    try:
        preflight = _preflight(context)
        for check in checks:
            result = _failed_preflight(check, preflight) if preflight else _run_one(check, context)
            report.results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        context.close()
        report.seconds = time.monotonic() - started
    return report


def _preflight(context: SuiteContext) -> str | None:
    """Can the trusted identity call GetInfo at all? Returns a problem, or None."""
    try:
        context.info()
    except grpc.RpcError as error:
        failure = describe_failure("GetInfo", error)
        return f"preflight GetInfo with the given certificate failed: {failure.code.name}: {failure.message[:150]}"
    return None


def _failed_preflight(check: Check, problem: str) -> CheckResult:
    return CheckResult(check.id, check.title, FAIL, check.rationale, problem, 0.0)


def _run_one(check: Check, context: SuiteContext) -> CheckResult:
    started = time.monotonic()
    try:
        detail = check.function(context) or ""
        outcome = PASS
    except CheckSkipped as skipped:
        outcome, detail = SKIP, str(skipped)
    except CheckFailed as failed:
        outcome, detail = FAIL, str(failed)
    except AssertionError as failed:
        outcome, detail = FAIL, str(failed) or "assertion failed"
    except grpc.RpcError as error:
        failure = describe_failure("", error)
        outcome = FAIL
        detail = f"unexpected {failure.code.name} {failure.reason or '(no ErrorInfo)'}: {failure.message[:150]}"
    except Exception as error:  # noqa: BLE001 - a crashing check is a failing check
        outcome, detail = FAIL, f"check crashed: {type(error).__name__}: {error}"
    return CheckResult(check.id, check.title, outcome, check.rationale, detail, time.monotonic() - started)


def write_json(report: SuiteReport, path) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report.to_json(), handle, indent=2)
        handle.write("\n")
