"""The check registry: every conformance check is a small function registered by id.

A check receives the shared SuiteContext and either returns (PASS, with an optional detail
line saying what was observed), raises CheckFailed (FAIL) or raises CheckSkipped (SKIP, with
the reason). Any other exception is a FAIL too: a check that crashes has not shown
conformance. The checks live in `CHECKS`, a protocol.plugins.Registry keyed by check id.

To add a check:
    @check("area.what", title="...", rationale="...", order=50)
    def what(ctx: SuiteContext) -> str: ...
in a module under checks/ (imported by checks/__init__.py), or in a plug-in whose entry point
(group `target_feedback.conformance_checks`, named by the check id) points at the decorated name.
`order` places it in the run (lower runs first; checks that restart the server or spend the
whole budget run last). `check` is the registry's decorator with the check's card (title,
rationale, order) attached: the one registration style, kept because 55 checks use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from protocol.plugins import Registry

if TYPE_CHECKING:
    from protocol.conformance.context import SuiteContext


class CheckFailed(AssertionError):
    """The server violated the protocol; the message is the one-line failure detail."""


class CheckSkipped(Exception):
    """The check cannot run here (missing option, budget too small, DP disabled, ...)."""


CheckFunction = Callable[["SuiteContext"], "str | None"]


@dataclass(frozen=True)
class Check:
    """A check function with its card; calling it runs the function."""

    id: str
    title: str
    rationale: str
    order: int
    function: CheckFunction

    def __call__(self, ctx: SuiteContext) -> str | None:
        return self.function(ctx)



def _load_check_modules() -> None:
    # Importing the package registers every check module exactly once.
    import protocol.conformance.checks  # noqa: F401


def _check_entry(check_id: str, value: Any) -> None:
    if not isinstance(value, Check):
        raise TypeError(f"conformance check {check_id!r} must be a Check (use @check), got {value!r}")
    if value.id != check_id:
        raise ValueError(f"conformance check {value.id!r} is registered under another id, {check_id!r}")


CHECKS: Registry[Check] = Registry(
    "conformance_checks", _load_check_modules, noun="conformance check", on_add=_check_entry
)


def check(check_id: str, *, title: str, rationale: str, order: int) -> Callable[[CheckFunction], Check]:
    """Register `function` as the check `check_id`. Ids are unique; a duplicate is a bug."""

    def register(function: CheckFunction) -> Check:
        registered = Check(check_id, title, " ".join(rationale.split()), order, function)
        CHECKS.add(check_id, registered)
        return registered

    return register


def all_checks() -> list[Check]:
    """Every registered check in run order (order, then id)."""
    return sorted((entry.value for entry in CHECKS), key=lambda c: (c.order, c.id))


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
