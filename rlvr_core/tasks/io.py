"""Reading and writing example files (JSONL, and parquet when pyarrow is installed).

Held-out files are secret: every error names the file, the line (or row) and the field, and
never quotes a row's content, so an error message can be logged or shown without leaking data.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rlvr_core.tasks.example import Example

JSONL_SUFFIXES = (".jsonl",)
PARQUET_SUFFIXES = (".parquet",)


class ExampleFileError(ValueError):
    """An example file is missing, unreadable or holds an invalid row (content never quoted)."""


def read_examples(path: str | Path, *, check_verifiers: bool = True) -> list[Example]:
    """Read examples from a `.jsonl` file (one JSON object per line) or a `.parquet` file.

    Each row has a required `prompt` and `answer` (numbers are converted to strings) and optional
    `id` (default f"row-{n}", n the 1-based line or row number), `task`, `domain`, `verifier`
    and `metadata`. Blank lines are skipped. With `check_verifiers`, every row's verifier must be
    registered in rlvr_core.verifiers, so a typo fails here rather than scoring 0 later.

    Raises ExampleFileError for: a missing file, an unsupported suffix, undecodable text, invalid
    JSON, an invalid field, duplicate ids, or a file with no examples.
    """
    path = Path(path)
    label = path.name
    where, rows = read_rows(path)
    known_verifiers = _known_verifiers() if check_verifiers else None
    examples: list[Example] = []
    first_seen: dict[str, int] = {}
    for number, row in rows:
        try:
            example = Example.from_json(row, default_id=f"row-{number}")
        except ValueError as error:
            raise ExampleFileError(f"{label} {where} {number}: {error}") from None
        if known_verifiers is not None and example.verifier not in known_verifiers:
            raise ExampleFileError(
                f"{label} {where} {number}: field 'verifier' names an unknown verifier; "
                f"known: {', '.join(sorted(known_verifiers))}"
            )
        if example.id in first_seen:
            # The id itself is not quoted: ids may be derived from content.
            raise ExampleFileError(
                f"{label} {where} {number}: field 'id' duplicates the id on {where} {first_seen[example.id]}"
            )
        first_seen[example.id] = number
        examples.append(example)
    if not examples:
        raise ExampleFileError(f"{label}: file holds no examples")
    return examples


def read_rows(path: str | Path, label: str | None = None) -> tuple[str, Iterator[tuple[int, Any]]]:
    """("line" or "row", (number, decoded row) pairs) of a .jsonl or .parquet file.

    Numbers are 1-based lines (JSONL, blank lines skipped) or rows (parquet, null fields
    dropped). Errors name `label` (default: the file name) and the line, never its content."""
    path = Path(path)
    label = label or path.name
    if not path.is_file():
        raise ExampleFileError(f"{label}: file not found")
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "line", _jsonl_rows(path, label)
    if suffix in PARQUET_SUFFIXES:
        return "row", _parquet_rows(path, label)
    raise ExampleFileError(
        f"{label}: unsupported file type {suffix or '(none)'!r}; use .jsonl (one JSON object per line) or .parquet"
    )


def write_examples(path: str | Path, examples: Iterable[Example]) -> None:
    """Write examples as JSONL, atomically (a temporary file renamed over `path`)."""
    path = Path(path)
    if path.suffix.lower() in PARQUET_SUFFIXES:
        raise ExampleFileError(f"{path.name}: write_examples writes JSONL; use a .jsonl path")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            for example in examples:
                out.write(json.dumps(example.to_json(), ensure_ascii=False, sort_keys=True))
                out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _jsonl_rows(path: Path, label: str) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ExampleFileError(f"{label} line {number}: not valid UTF-8") from None
            if number == 1:
                text = text.removeprefix("\ufeff")  # tolerate a byte-order mark
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as error:
                # error.msg is the parser's reason only ("Expecting value"); never the text.
                raise ExampleFileError(
                    f"{label} line {number}: invalid JSON ({error.msg} at column {error.colno})"
                ) from None
            yield number, row


def _parquet_rows(path: Path, label: str) -> Iterator[tuple[int, Any]]:
    try:
        from pyarrow import parquet
    except ImportError:
        raise ExampleFileError(
            f"{label}: reading parquet needs pyarrow; install it (pip install pyarrow) or convert to JSONL"
        ) from None
    try:
        table = parquet.read_table(path)
    except Exception as error:  # noqa: BLE001 - pyarrow raises many types; only the type is shown
        raise ExampleFileError(f"{label}: not a readable parquet file ({type(error).__name__})") from None
    for number, row in enumerate(table.to_pylist(), start=1):
        # Parquet has a fixed schema, so an absent optional field shows up as null: drop it.
        yield number, {key: value for key, value in row.items() if value is not None}


def _known_verifiers() -> set[str]:
    from rlvr_core.verifiers import verifier_names

    return set(verifier_names())
