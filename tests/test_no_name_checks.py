"""No code compares a registered name outside its registry entry (verl PR #7473's problem).

When the trainer writes `if lookahead == "adamw"`, a new entry silently takes the other branch.
An entry exposes a capability instead (`valid_privacy_filter`, `uses_target_feedback`, ...),
and callers ask the entry. This test parses the source (not tests/) with `ast` and fails on
any comparison of a string literal that is a registered name of a watched registry:
`x == "name"`, `x != "name"`, `x in ("name", ...)` (a literal tuple/list/set) or `case "name":`,
outside the entry's own module, the registry's module and the modules a registry allows.

To watch another registry, add one `Watched(...)` line to WATCHED.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = ("protocol", "rlvr_core", "trainer_node", "target_owner_node", "lab", "tools")
SKIPPED = ("protocol/generated",)


def defining_module(value: Any) -> str:
    return value.__module__


@dataclass(frozen=True)
class Watched:
    registry: str  # "package.module:ATTRIBUTE" of a protocol.plugins.Registry
    allowed: tuple[str, ...] = ()  # further modules (dotted) that may compare its names
    module_of: Callable[[Any], str] = defining_module  # where an entry's value is defined

    def load(self) -> Any:
        module, attribute = self.registry.split(":")
        return getattr(importlib.import_module(module), attribute)

    def allowed_modules(self) -> dict[str, set[str]]:
        """Registered name -> the modules allowed to compare it."""
        registry = self.load()
        always = {self.registry.split(":")[0], *self.allowed}
        return {entry.name: {self.module_of(entry.value), *always} for entry in registry}


WATCHED = [
    Watched("rlvr_core.engines.registry:ENGINES"),
    Watched("rlvr_core.verifiers.base:VERIFIERS"),
    Watched("rlvr_core.tasks.rubric:RUBRIC_ITEMS"),
    Watched("protocol.privacy.accountants:ACCOUNTANTS"),
    Watched("trainer_node.grpo.advantages:ADVANTAGES"),
    Watched("trainer_node.grpo.losses:LOSSES"),
    Watched("trainer_node.grpo.losses:AGGREGATIONS"),
    Watched("trainer_node.grpo.lookahead:LOOKAHEAD_OPTIMIZERS"),
    Watched("trainer_node.policies.l2rr_estimators:ESTIMATORS"),
    Watched("protocol.conformance.registry:CHECKS", module_of=lambda check: check.function.__module__),
    Watched("trainer_node.policies.base:POLICIES"),
    Watched("trainer_node.grpo.update_seam:SELECTIONS"),
    Watched("trainer_node.grpo.update_seam:REWEIGHTINGS"),
]

import lab.policies  # noqa: E402,F401 - registers the simulation-only policies, so their names are watched too


@dataclass(frozen=True)
class NameCheck:
    path: str
    line: int
    name: str
    code: str


def compared_literals(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """(node, literal) for every string literal compared by ==/!=, `in` a literal collection, or `case`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for index, op in enumerate(node.ops):
                left, right = operands[index], operands[index + 1]
                if isinstance(op, (ast.Eq, ast.NotEq)):
                    candidates = [left, right]
                elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                    candidates = list(right.elts)
                else:
                    continue
                for candidate in candidates:
                    if isinstance(candidate, ast.Constant) and isinstance(candidate.value, str):
                        yield node, candidate.value
        elif (
            isinstance(node, ast.MatchValue)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node, node.value.value


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> Iterator[Path]:
    for root in SOURCE_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if not str(path.relative_to(REPO)).startswith(SKIPPED):
                yield path


def name_checks(source: str, path: str, module: str, allowed: dict[str, set[str]]) -> list[NameCheck]:
    found = []
    for node, literal in compared_literals(ast.parse(source)):
        if literal in allowed and module not in allowed[literal]:
            found.append(NameCheck(path, node.lineno, literal, ast.get_source_segment(source, node) or ""))
    return found


def all_allowed() -> dict[str, set[str]]:
    allowed: dict[str, set[str]] = {}
    for watched in WATCHED:
        for name, modules in watched.allowed_modules().items():
            allowed.setdefault(name, set()).update(modules)
    return allowed


def test_no_registered_name_is_compared_outside_its_entry():
    allowed = all_allowed()
    found = []
    for path in source_files():
        found += name_checks(path.read_text(), str(path.relative_to(REPO)), module_name(path), allowed)
    assert not found, "compare a capability of the entry instead of its name:\n" + "\n".join(
        f"{c.path}:{c.line}: {c.name!r} in `{c.code}`" for c in found
    )


@pytest.mark.parametrize("watched", WATCHED, ids=lambda w: w.registry)
def test_every_watched_registry_has_entries_with_a_defining_module(watched):
    modules = watched.allowed_modules()
    assert modules and all(all(isinstance(m, str) and m for m in ms) for ms in modules.values())


ALLOWED = {"adamw": {"trainer_node.grpo.lookahead"}, "prv": {"protocol.privacy.accountants"}}


@pytest.mark.parametrize(
    "code",
    [
        'weight = 0.0 if s.lookahead == "adamw" else 1.0',
        'if "prv" != accountant: pass',
        'ok = accountant in ("rdp", "prv")',
        'ok = accountant not in ["prv"]',
        'ok = accountant in {"prv", "gdp"}',
        'match rule:\n    case "adamw":\n        pass',
        'a = b == c == "prv"',
    ],
)
def test_the_scan_finds_each_form_of_name_check(code):
    (found,) = name_checks(code, "x.py", "trainer_node.trainer", ALLOWED)
    assert found.line >= 1 and found.name in ALLOWED


@pytest.mark.parametrize(
    "code",
    [
        '"""Docstrings may say adamw."""',
        'print("prv")',
        'rules = {"adamw": 1}',
        'ok = accountant in names',
        'ok = "prv" in text',  # substring test on a variable, not a name check
        'ok = rule == "adamwx"',
    ],
)
def test_the_scan_ignores_mentions_that_are_not_comparisons(code):
    assert name_checks(code, "x.py", "trainer_node.trainer", ALLOWED) == []


def test_the_entry_module_may_compare_its_own_name():
    assert name_checks('x = rule == "adamw"', "lookahead.py", "trainer_node.grpo.lookahead", ALLOWED) == []
