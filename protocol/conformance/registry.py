"""The check registry: every conformance check is a small function registered by id.

A check receives the shared SuiteContext and either returns (PASS, with an optional detail
line saying what was observed), raises CheckFailed (FAIL) or raises CheckSkipped (SKIP, with
the reason). Any other exception is a FAIL too: a check that crashes has not shown
conformance. To add a check, write a function in one of the modules under checks/ and
decorate it with @check(...); `order` places it in the run (lower runs first; checks that
restart the server or spend the whole budget run last).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protocol.conformance.context import SuiteContext


class CheckFailed(AssertionError):
    """The server violated the protocol; the message is the one-line failure detail."""


class CheckSkipped(Exception):
    """The check cannot run here (missing option, budget too small, DP disabled, ...)."""


CheckFunction = Callable[["SuiteContext"], "str | None"]


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    rationale: str
    order: int
    function: CheckFunction


_REGISTRY: dict[str, Check] = {}


def check(check_id: str, *, title: str, rationale: str, order: int) -> Callable[[CheckFunction], CheckFunction]:
    """Register `function` as the check `check_id`. Ids are unique; a duplicate is a bug."""

    def register(function: CheckFunction) -> CheckFunction:
        if check_id in _REGISTRY:
            raise ValueError(f"conformance check {check_id!r} is registered twice")
        _REGISTRY[check_id] = Check(check_id, title, " ".join(rationale.split()), order, function)
        return function

    return register


def all_checks() -> list[Check]:
    """Every registered check in run order (order, then id)."""
    _load_check_modules()
    return sorted(_REGISTRY.values(), key=lambda c: (c.order, c.id))


def select_checks(only: list[str] | None) -> list[Check]:
    """The checks named in `only` (all when None), in run order. Unknown ids are an error
    that lists the known ones; an id ending in '*' selects every id with that prefix."""
    checks = all_checks()
    if not only:
        return checks
    known = {c.id for c in checks}
    wanted: set[str] = set()
    for item in only:
        if item.endswith("*"):
            matches = {i for i in known if i.startswith(item[:-1])}
        else:
            matches = {item} & known
        if not matches:
            raise ValueError(f"unknown conformance check {item!r}; known checks: {', '.join(sorted(known))}")
        wanted |= matches
    return [c for c in checks if c.id in wanted]


def expect(condition: bool, detail: str) -> None:
    """Fail the running check with `detail` unless `condition` holds."""
    if not condition:
        raise CheckFailed(detail)


def _load_check_modules() -> None:
    # Importing the package registers every check module exactly once.
    import protocol.conformance.checks  # noqa: F401
