"""Held-out files the suite writes for an owner it launches (--launch-cmd).

The format is the project's example format (rlvr_core/tasks/example.py, io.py): JSON Lines, one
object per row with `id`, `prompt`, `answer` and `verifier`. Every row names the
`exact_match` verifier: the answer is compared with the completion's first line after light
normalisation, so a one-token completion "7" matches the answer "7". Row ids are stable across
the files of one check: a correct owner draws a row's randomness from (seed, row id, sample
index), so the same id must mean the same row in every launch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

VERIFIER = "exact_match"


@dataclass(frozen=True)
class HeldoutRow:
    id: str
    prompt: str
    answer: str


def write_heldout(path: Path, rows: Iterable[HeldoutRow]) -> Path:
    """Write `rows` as JSONL to `path` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": r.id, "prompt": r.prompt, "answer": r.answer, "verifier": VERIFIER}) for r in rows]
    if not lines:
        raise ValueError("a held-out file needs at least one row")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def arithmetic_rows(count: int, prefix: str = "row") -> list[HeldoutRow]:
    """`count` plain rows "What is a + b?" with their sums as answers (ids prefix-0000, ...)."""
    rows = []
    for i in range(count):
        a, b = i % 7 + 1, (3 * i) % 5 + 1
        rows.append(HeldoutRow(f"{prefix}-{i:04d}", f"What is {a} + {b}?", str(a + b)))
    return rows
