"""One verifiable example: the unit of source data, held-out data and test data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Example:
    """A prompt with a verifiable answer.

    `metadata` carries whatever the verifier needs beyond the answer (for reasoning-gym,
    the dataset entry's metadata) and must be JSON-serialisable.
    """

    id: str
    prompt: str
    answer: str
    task: str = ""
    domain: str = ""
    verifier: str = "exact_match"
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

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
