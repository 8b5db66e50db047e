"""Rubric tasks (issue 43): a task's prompt plus k checkable rubric items, graded by the fraction met.

SetGRPO (seed 002) is a method for rubric-based RL: a grader scores each response over several
rubric items, so a score is graded in [0, 1] and two graders disagree by degrees, not by a flipped
0/1. A testbed entry with `rubric = { items = [...] }` turns a reasoning-gym generator's rows into
such a task:

    [[source]]
    task = "letter_counting"
    domain = "count"
    size = 300
    config = { min_words = 3, max_words = 5 }
    rubric = { items = [{ name = "correct" }, { name = "starts_with", choices = "#@%" },
                        { name = "ends_with", choices = "!?~" }, { name = "max_length", slack = 1 },
                        { name = "forbidden", choices = "0123456789" }] }

Each row's items are drawn from the row's own seeded generator (a "start with" character, a length
bound, a forbidden character ...), stated in the prompt ("... Rules: start with "#"; end with "!";
...") and stored, as public facts of the prompt, in `metadata["rubric"]`. The reference answer is
built to meet every item (the task's answer shaped by the items in order: "#3!"), so the tiny
policy's warm-up learns the form; the exact grader `rubric` (rlvr_core/verifiers/rubric.py) scores
the fraction of items an answer meets.

Item kinds are registered in `RUBRIC_ITEMS` (rlvr_core/tasks/rubric_items.py), each with typed
options (how the testbed configures it) and typed params (what a row carries). To add one: a
`RubricItem` subclass with `Options` and `Params` models, `@RUBRIC_ITEMS.register("x", options=...)`.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from protocol.plugins import Registry, subclass_entries
from rlvr_core.tasks.example import Example

# The exact grader every rubric row names (registered in rlvr_core/verifiers/rubric.py).
EXACT_GRADER = "rubric"
METADATA_KEY = "rubric"
RULES_MARK = " Rules: "  # what separates the generator's question from the rules the prompt appends


class ItemParams(BaseModel):
    """What one row's item carries in metadata["rubric"] (public: the prompt states it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str


class RubricItem(ABC):
    """One kind of checkable rubric item. `draw` picks a row's params and shapes the reference answer;
    `passes` and `describe` read the params only (the grader has no options, only the row)."""

    name: str = ""
    Params: ClassVar[type[ItemParams]] = ItemParams

    def __init__(self, options: Any):
        self.options = options

    @abstractmethod
    def draw(self, rng: random.Random, answer: str, reference: str) -> tuple[ItemParams, str]:
        """(this row's params, the reference answer after this item): `answer` is the task's own
        answer, `reference` the answer shaped by the items before this one."""

    @classmethod
    @abstractmethod
    def passes(cls, line: str, params: ItemParams) -> bool:
        """Whether the answer line (non-empty, extracted) meets the item."""

    @classmethod
    @abstractmethod
    def describe(cls, params: ItemParams) -> str:
        """The rule as the prompt states it, e.g. 'start with "#"'."""


def _import_builtin_items() -> None:
    import rlvr_core.tasks.rubric_items  # noqa: F401  (registers the built-in kinds)


RUBRIC_ITEMS: Registry[type[RubricItem]] = Registry(
    "rubric_items", _import_builtin_items, noun="rubric item", on_add=subclass_entries(RubricItem, "rubric item"))


def make_item(raw: Mapping[str, Any]) -> RubricItem:
    """An item kind built from `{ name = "...", <options> }`; pydantic.ValidationError at the option."""
    from rlvr_core.configuration import field_error, validate_options

    name = raw.get("name") if isinstance(raw, Mapping) else None
    if not isinstance(name, str) or name not in RUBRIC_ITEMS:
        raise field_error("RubricItem", ("name",), "unknown_entry",
                          f"unknown rubric item {name!r}; known: {', '.join(RUBRIC_ITEMS.names())}", name)
    return RUBRIC_ITEMS.get(name)(validate_options(RUBRIC_ITEMS.options_model(name), dict(raw),
                                                   part=f"rubric item {name!r}"))


def parse_row_items(raw: Any) -> list[tuple[type[RubricItem], ItemParams]]:
    """A row's metadata["rubric"] as (kind, params) pairs. Untrusted (an owner's or a user's rows):
    ValueError naming the item and the field, never quoting a value (held-out rows are secret)."""
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"metadata[{METADATA_KEY!r}] must be a non-empty list of rubric items")
    items = []
    for index, item in enumerate(raw):
        where = f"metadata[{METADATA_KEY!r}][{index}]"
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or name not in RUBRIC_ITEMS:
            raise ValueError(f"{where}.name: not a rubric item; known: {', '.join(RUBRIC_ITEMS.names())}")
        kind = RUBRIC_ITEMS.get(name)
        try:
            items.append((kind, kind.Params.model_validate(dict(item))))
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "(item)"
            raise ValueError(f"{where}.{field}: {first['type']}") from None
    return items


def item_verdicts(line: str, items: Sequence[tuple[type[RubricItem], ItemParams]]) -> list[bool]:
    """Each item's verdict on an extracted answer line; an empty line meets none (no answer given)."""
    if not line:
        return [False] * len(items)
    return [bool(kind.passes(line, params)) for kind, params in items]


def question_of(example: Example) -> str:
    """The generator's own question of a row: its prompt without the rules a rubric appended. Two
    rows with one question are one prompt for the splits (a test row must not reuse a training
    question under other rules)."""
    if METADATA_KEY not in example.metadata:
        return example.prompt
    return example.prompt.rsplit(RULES_MARK, 1)[0]


class RubricSpec(BaseModel):
    """A testbed entry's rubric: the item kinds every row gets, in the order they shape the answer."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    items: list[dict[str, Any]] = Field(min_length=2)
    """Item kinds with their options, e.g. `{ name = "starts_with", choices = "#@%" }`. Items that
    shape the reference answer (starts_with, ends_with) come before those that bound it
    (max_length, forbidden): every row's reference must meet every item (checked at build)."""

    @field_validator("items")
    @classmethod
    def _known_items(cls, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, raw in enumerate(items):
            try:
                make_item(raw)
            except ValidationError as error:
                from rlvr_core.configuration import field_path

                first = error.errors()[0]
                message = str(first["msg"]).removeprefix("Value error, ")
                raise ValueError(f"[{index}].{field_path(first['loc'])}: {message}") from None
        return items

    def kinds(self) -> list[RubricItem]:
        return [make_item(raw) for raw in self.items]

    def apply(self, example: Example, seed: int) -> Example:
        """The row as a rubric task: items drawn from a generator keyed by (seed, prompt), so copies of
        one prompt get one rubric; the prompt states the rules, the answer meets them all. ValueError
        naming the item when a reference cannot meet it (an item order that cannot be satisfied)."""
        digest = hashlib.sha256(f"rubric/{seed}/{example.prompt}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        answer = example.answer.strip()
        reference, drawn = answer, []
        for index, kind in enumerate(self.kinds()):
            try:
                params, reference = kind.draw(rng, answer, reference)
            except ValueError as error:
                raise ValueError(f"items[{index}] ({kind.name}): {error}") from None
            drawn.append((type(kind), params))
        for index, verdict in enumerate(item_verdicts(reference, drawn)):
            if not verdict:
                raise ValueError(f"items[{index}] ({drawn[index][0].name}): the reference answer does not meet "
                                 f"it; list the items that shape the answer before those that bound it")
        rules = "; ".join(kind.describe(params) for kind, params in drawn)
        metadata = {**example.metadata, METADATA_KEY: [params.model_dump() for _, params in drawn]}
        return example.__class__(id=example.id, prompt=f"{example.prompt}{RULES_MARK}{rules}.", answer=reference,
                                 task=example.task, domain=example.domain, verifier=EXACT_GRADER,
                                 metadata=metadata, history=example.history)
