"""One verifiable example: the unit of source data, held-out data and test data."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The fields a serialised example may carry; anything else is a typo or a foreign column.
EXAMPLE_FIELDS = ("id", "prompt", "answer", "task", "domain", "verifier", "metadata")


@dataclass(frozen=True)
class Example:
    """A prompt with a verifiable answer.

    `metadata` carries whatever the verifier needs beyond the answer (for reasoning-gym,
    the dataset entry's metadata) and must be JSON-serialisable. `history` holds chat turns
    before the prompt, as (role, content) pairs (e.g. a system message), when a trainer's own
    prompt data gives prompts as chat messages (rlvr_core.tasks.prompt_data); the prompt is
    then the last user turn. It is never read from or written to example files, so an
    owner's held-out rows are always plain prompts.
    """

    id: str
    prompt: str
    answer: str
    task: str = ""
    domain: str = ""
    verifier: str = "exact_match"
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    history: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prompt": self.prompt,
            "answer": self.answer,
            "task": self.task,
            "domain": self.domain,
            "verifier": self.verifier,
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, row: Any, default_id: str | None = None) -> Example:
        """Build an Example from a decoded JSON object, validating every field.

        Required: `prompt` (non-empty string) and `answer` (string, or a number, which is
        converted with str()). Optional: `id` (string or integer; `default_id` when absent),
        `task`, `domain`, `verifier` (strings) and `metadata` (an object). Unknown fields are
        rejected so that a typo ("answers") is not silently read as a missing answer.

        Raises ValueError naming the field. The message never quotes a value: held-out rows are
        secret, so only field names and type names may appear in it.
        """
        if not isinstance(row, Mapping):
            raise ValueError(f"row must be a JSON object, got {_type_name(row)}")
        unknown = sorted(str(key) for key in row if key not in EXAMPLE_FIELDS)
        if unknown:
            raise ValueError(
                f"unknown field(s) {', '.join(repr(k) for k in unknown)}; allowed: {', '.join(EXAMPLE_FIELDS)}"
            )
        kwargs: dict[str, Any] = {
            "id": _read_id(row, default_id),
            "prompt": _read_text(row, "prompt", required=True),
            "answer": _read_answer(row),
        }
        for name in ("task", "domain", "verifier"):
            value = _read_text(row, name, required=False)
            if value is not None:
                kwargs[name] = value
        metadata = row.get("metadata")
        if metadata is not None:
            if not isinstance(metadata, Mapping):
                raise ValueError(f"field 'metadata' must be an object, got {_type_name(metadata)}")
            kwargs["metadata"] = dict(metadata)
        return cls(**kwargs)


def _type_name(value: Any) -> str:
    return type(value).__name__


def _read_text(row: Mapping, name: str, required: bool) -> str | None:
    value = row.get(name)
    if value is None:
        if required:
            raise ValueError(f"field {name!r} is missing")
        return None
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a string, got {_type_name(value)}")
    if required and not value.strip():
        raise ValueError(f"field {name!r} is empty")
    return value


def _read_answer(row: Mapping) -> str:
    value = row.get("answer")
    if value is None:
        raise ValueError("field 'answer' is missing")
    # bool is an int subclass; True as an answer is almost certainly a broken export.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"field 'answer' must be a string or a number, got {_type_name(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("field 'answer' must be a finite number")
    text = value if isinstance(value, str) else str(value)
    if not text.strip():
        raise ValueError("field 'answer' is empty")
    return text


def _read_id(row: Mapping, default_id: str | None) -> str:
    value = row.get("id")
    if value is None:
        if default_id is None:
            raise ValueError("field 'id' is missing")
        return default_id
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"field 'id' must be a string or an integer, got {_type_name(value)}")
    text = str(value)
    if not text.strip():
        raise ValueError("field 'id' is empty")
    return text
