"""The built-in rubric item kinds (rlvr_core/tasks/rubric.py): constraints on an answer's content and
form that a tiny policy can learn to meet in part, each registered with typed options.

    correct       the task's own answer appears in the line as a whole token ("#3!" holds "3")
    starts_with   the line starts with a character drawn per row from `choices`
    ends_with     the line ends with a character drawn per row from `choices`
    max_length    the line has at most len(reference) + `slack` characters
    forbidden     the line does not contain a character drawn per row from the `choices` the
                  reference does not use (e.g. a digit a wrong count would bring)

Characters that the answer-extraction rule strips (whitespace; ".,;:" at the end) are refused as
choices: an item the extracted line can never meet would be noise, not a rubric.
"""

from __future__ import annotations

import random
import re
from typing import Literal

from pydantic import Field, field_validator

from rlvr_core.configuration import OptionsSection
from rlvr_core.tasks.rubric import RUBRIC_ITEMS, ItemParams, RubricItem

_STRIPPED_AT_END = ".,;:"  # rlvr_core.verifiers.base.extract_answer strips these at the end


class _ChoicesOptions(OptionsSection):
    choices: str = Field(min_length=1, max_length=64, description="The characters a row's character is "
                         "drawn from (uniformly).")

    @field_validator("choices")
    @classmethod
    def _usable(cls, choices: str) -> str:
        if any(ch.isspace() or not ch.isprintable() for ch in choices):
            raise ValueError("must hold printable, non-space characters only (the answer line is stripped)")
        if len(set(choices)) != len(choices):
            raise ValueError("lists a character twice")
        return choices


class _CharParams(ItemParams):
    char: str = Field(min_length=1, max_length=1)


# --- correct -------------------------------------------------------------------------------------

class CorrectOptions(OptionsSection):
    name: Literal["correct"] = "correct"


class CorrectParams(ItemParams):
    answer: str = Field(min_length=1, max_length=256)


@RUBRIC_ITEMS.register("correct", options=CorrectOptions)
class Correct(RubricItem):
    """The content item: the task's answer as a whole token, case-insensitive (not run into other
    letters or digits, so "13" does not hold "3")."""

    Params = CorrectParams

    def draw(self, rng: random.Random, answer: str, reference: str) -> tuple[CorrectParams, str]:
        return CorrectParams(name=self.name, answer=answer), reference

    @classmethod
    def passes(cls, line: str, params: CorrectParams) -> bool:
        pattern = rf"(?<![0-9A-Za-z]){re.escape(params.answer)}(?![0-9A-Za-z])"
        return re.search(pattern, line, flags=re.IGNORECASE) is not None

    @classmethod
    def describe(cls, params: CorrectParams) -> str:
        return "give the right answer"


# --- starts_with / ends_with ---------------------------------------------------------------------

class StartsWithOptions(_ChoicesOptions):
    name: Literal["starts_with"] = "starts_with"


@RUBRIC_ITEMS.register("starts_with", options=StartsWithOptions)
class StartsWith(RubricItem):
    """A form item the policy meets by copying a character from the prompt: prepends it."""

    Params = _CharParams

    def draw(self, rng: random.Random, answer: str, reference: str) -> tuple[_CharParams, str]:
        char = rng.choice(self.options.choices)
        return _CharParams(name=self.name, char=char), char + reference

    @classmethod
    def passes(cls, line: str, params: _CharParams) -> bool:
        return line.startswith(params.char)

    @classmethod
    def describe(cls, params: _CharParams) -> str:
        return f'start with "{params.char}"'


class EndsWithOptions(_ChoicesOptions):
    name: Literal["ends_with"] = "ends_with"

    @field_validator("choices")
    @classmethod
    def _not_stripped(cls, choices: str) -> str:
        stripped = sorted(set(choices) & set(_STRIPPED_AT_END))
        if stripped:
            raise ValueError(f"holds {''.join(stripped)!r}, which the answer line loses at its end; use others, "
                             f"e.g. '!?~'")
        return choices


@RUBRIC_ITEMS.register("ends_with", options=EndsWithOptions)
class EndsWith(RubricItem):
    """The mirror of starts_with: appends a character drawn per row."""

    Params = _CharParams

    def draw(self, rng: random.Random, answer: str, reference: str) -> tuple[_CharParams, str]:
        char = rng.choice(self.options.choices)
        return _CharParams(name=self.name, char=char), reference + char

    @classmethod
    def passes(cls, line: str, params: _CharParams) -> bool:
        return line.endswith(params.char)

    @classmethod
    def describe(cls, params: _CharParams) -> str:
        return f'end with "{params.char}"'


# --- max_length ----------------------------------------------------------------------------------

class MaxLengthOptions(OptionsSection):
    name: Literal["max_length"] = "max_length"
    slack: int = Field(default=1, ge=0, le=32, description="Characters allowed beyond the reference "
                       "answer's length (as the items before this one shaped it).")


class _LengthParams(ItemParams):
    chars: int = Field(ge=1, le=4096)


@RUBRIC_ITEMS.register("max_length", options=MaxLengthOptions)
class MaxLength(RubricItem):
    """A form item that rambling or a repeated symbol fails."""

    Params = _LengthParams

    def draw(self, rng: random.Random, answer: str, reference: str) -> tuple[_LengthParams, str]:
        return _LengthParams(name=self.name, chars=len(reference) + self.options.slack), reference

    @classmethod
    def passes(cls, line: str, params: _LengthParams) -> bool:
        return len(line) <= params.chars

    @classmethod
    def describe(cls, params: _LengthParams) -> str:
        return f"at most {params.chars} characters"


# --- forbidden -----------------------------------------------------------------------------------

class ForbiddenOptions(_ChoicesOptions):
    name: Literal["forbidden"] = "forbidden"


@RUBRIC_ITEMS.register("forbidden", options=ForbiddenOptions)
class Forbidden(RubricItem):
    """A character the answer must not contain, drawn among the choices the reference does not use."""

    Params = _CharParams

    def draw(self, rng: random.Random, answer: str, reference: str) -> tuple[_CharParams, str]:
        free = [ch for ch in self.options.choices if ch not in reference]
        if not free:
            raise ValueError(f"every one of choices {self.options.choices!r} is in the reference answer; "
                             f"add characters the answers do not use")
        return _CharParams(name=self.name, char=rng.choice(free)), reference

    @classmethod
    def passes(cls, line: str, params: _CharParams) -> bool:
        return params.char not in line

    @classmethod
    def describe(cls, params: _CharParams) -> str:
        return f'no "{params.char}"'
