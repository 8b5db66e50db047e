"""A trainer's own prompt set: JSONL, Parquet, a folder saved by `datasets`, or verl's RL parquet.

    [data.prompts]                       # trainer_node/config.py's [data] section
    path = "prompts.parquet"             # .jsonl, .parquet, or a folder written by Dataset.save_to_disk
    format = "auto"                      # auto | jsonl | parquet | datasets | verl
    verifier = "exact_match"             # for rows that name none
    columns = { prompt = "question", answer = "solution", cluster = "topic" }

A column name may be a dotted path into nested objects ("reward_model.ground_truth").
`format = "verl"` (or "auto" on rows that have verl's `data_source` and `reward_model`) reads
verl's RL layout: `prompt` (chat messages), `reward_model.ground_truth` (the answer),
`data_source` (the cluster) and `extra_info` (the verifier's metadata; its `index` is the id).

Columns (`columns.<name>`; each has a default and a missing optional column is skipped):
- prompt (required, default "prompt"): text, or chat messages [{"role", "content"}, ...]
  whose last message is the user's (earlier ones, e.g. a system message, become the
  example's `history`, which needs a chat rendering);
- answer (required, default "answer"): text or a number;
- id (default "id", else the row number): a row's sampling randomness is keyed by it;
- cluster (default "domain", else "data_source"): L2RR's cluster; rows without one share "all";
- verifier (default "verifier"): a registered verifier per row, else the `verifier` default;
- metadata (default "metadata", else "extra_info"): an object handed to the verifier.
Other columns are ignored. Every error names the file, the row and the column, and never
quotes a value (the same rule as the owner's files, rlvr_core/tasks/io.py, whose readers this
reuses).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from rlvr_core.configuration import ConfigPath, Section
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.io import ExampleFileError, read_rows
from rlvr_core.tasks.rendering import parse_chat_turns

DEFAULT_CLUSTER = "all"
VERL_COLUMNS = {
    "prompt": "prompt", "answer": "reward_model.ground_truth", "cluster": "data_source",
    "metadata": "extra_info", "id": "extra_info.index", "verifier": None,
}


class PromptDataError(ValueError):
    """A prompt set that cannot be used; the message names the file, the row and the column."""


class PromptColumns(Section):
    """Which column holds what (dotted paths reach into nested objects)."""

    prompt: str = Field(default="prompt", description="Prompt text, or chat messages ending with the user's.")
    answer: str = Field(default="answer", description="The reference answer (text or a number).")
    id: str | None = Field(default=None, description="Stable row id (default: 'id' if present, else the row "
                           "number).")
    cluster: str | None = Field(default=None, description="L2RR's cluster (default: 'domain', else "
                                "'data_source', else one cluster).")
    verifier: str | None = Field(default=None, description="A registered verifier name per row (default: "
                                 "'verifier' if present).")
    metadata: str | None = Field(default=None, description="An object for the verifier (default: 'metadata', "
                                 "else 'extra_info').")


class PromptSetSpec(Section):
    """`[data.prompts]`: the trainer's own source prompts (instead of a testbed)."""

    path: ConfigPath = Field(description="A .jsonl or .parquet file, or a folder saved by `datasets` "
                             "(Dataset.save_to_disk), relative to the config file.")
    format: Literal["auto", "jsonl", "parquet", "datasets", "verl"] = Field(
        default="auto",
        description="auto (by suffix; a folder is a `datasets` folder; verl's columns are recognised), jsonl, "
        "parquet, datasets, or verl (verl's RL parquet layout).",
    )
    split: str | None = Field(default=None, description="The split of a `datasets` folder holding several "
                              "(default: 'train').")
    verifier: str | None = Field(
        default=None, description="The verifier of rows that name none (a registered name, built-in or plug-in)."
    )
    columns: PromptColumns = Field(default_factory=PromptColumns, description="Which column holds what.")

    @field_validator("verifier")
    @classmethod
    def _known_verifier(cls, name: str | None) -> str | None:
        if name is not None:
            from rlvr_core.verifiers import verifier_names

            if name not in verifier_names():
                raise ValueError(f"unknown verifier {name!r}; known: {', '.join(verifier_names())} (a plug-in "
                                 "registers through the entry-point group target_feedback.verifiers)")
        return name


@dataclass(frozen=True)
class PromptSet:
    """The examples and, aligned with them, each one's cluster."""

    examples: tuple[Example, ...]
    clusters: tuple[str, ...]

    def cluster_of(self) -> dict[str, str]:
        return {example.id: cluster for example, cluster in zip(self.examples, self.clusters)}


def read_prompt_set(spec: PromptSetSpec) -> PromptSet:
    """Read and check every row (verifier registered and able to score it); PromptDataError on the first bad one."""
    path = Path(spec.path)
    label = str(path)
    where, rows = _rows(path, spec, label)
    known = _verifiers()
    examples: list[Example] = []
    clusters: list[str] = []
    first_row: dict[str, int] = {}
    mapping: dict[str, str | None] | None = None
    for number, row in rows:
        at = f"{label} {where} {number}"
        if not isinstance(row, Mapping):
            raise PromptDataError(f"{at}: must be an object (a table row), got {type(row).__name__}")
        if mapping is None:
            mapping = _columns(spec, row)
        example, cluster = _example(row, mapping, spec, number, at, known)
        if example.id in first_row:
            raise PromptDataError(f"{at}: column {mapping['id'] or 'id'!r} duplicates the id of {where} "
                                  f"{first_row[example.id]}; ids key each row's sampling randomness")
        first_row[example.id] = number
        examples.append(example)
        clusters.append(cluster)
    if not examples:
        raise PromptDataError(f"{label}: holds no prompts")
    return PromptSet(tuple(examples), tuple(clusters))


# -- rows ------------------------------------------------------------------------------------

def _rows(path: Path, spec: PromptSetSpec, label: str) -> tuple[str, Iterator[tuple[int, Any]]]:
    container = spec.format
    if container in ("auto", "verl"):
        container = "datasets" if path.is_dir() else ("jsonl" if path.suffix.lower() == ".jsonl" else "parquet")
    if container == "datasets":
        return "row", _datasets_rows(path, spec.split, label)
    expected = ".jsonl" if container == "jsonl" else ".parquet"
    if path.is_file() and path.suffix.lower() != expected:
        raise PromptDataError(f"data.prompts.format: {container} expects a {expected} file; {label} is not one")
    try:
        where, rows = read_rows(path, label)
    except ExampleFileError as error:
        raise PromptDataError(str(error)) from None
    return where, _reraise(rows)


def _reraise(rows: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
    try:
        yield from rows
    except ExampleFileError as error:
        raise PromptDataError(str(error)) from None


def _datasets_rows(path: Path, split: str | None, label: str) -> Iterator[tuple[int, Any]]:
    if not path.is_dir():
        raise PromptDataError(f"{label}: not a folder; format 'datasets' reads a folder written by "
                              "Dataset.save_to_disk")
    try:
        import datasets
    except ImportError:
        raise PromptDataError(f"{label}: reading a `datasets` folder needs the datasets library: pip install "
                              "datasets (or export it to parquet: dataset.to_parquet('prompts.parquet'))") from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:  # noqa: BLE001 - datasets raises many types; only the type is shown
        raise PromptDataError(f"{label}: not a folder written by save_to_disk ({type(error).__name__})") from None
    if isinstance(loaded, datasets.DatasetDict):
        names = sorted(loaded)
        chosen = split or ("train" if "train" in loaded else (names[0] if len(names) == 1 else None))
        if chosen not in loaded:
            raise PromptDataError(f"data.prompts.split: {label} holds the splits {', '.join(names)}; name one")
        loaded = loaded[chosen]
    elif split is not None:
        raise PromptDataError(f"data.prompts.split: {label} holds a single dataset, not splits; remove split")
    return ((number, row) for number, row in enumerate(loaded, start=1))


# -- columns ---------------------------------------------------------------------------------

def _columns(spec: PromptSetSpec, first: Mapping[str, Any]) -> dict[str, str | None]:
    """The column of each field: configured, verl's, or the first default present in the first row."""
    configured = spec.columns.model_dump()
    explicit = spec.columns.model_fields_set
    verl = spec.format == "verl" or (
        spec.format != "jsonl" and not explicit and {"data_source", "reward_model"} <= set(first))
    if verl:
        return {**VERL_COLUMNS, **{name: configured[name] for name in explicit}}
    defaults = {"id": ("id",), "cluster": ("domain", "data_source"), "verifier": ("verifier",),
                "metadata": ("metadata", "extra_info")}
    mapping = dict(configured)
    for name, candidates in defaults.items():
        if mapping[name] is None:
            mapping[name] = next((c for c in candidates if c in first), None)
    return mapping


def lookup_column(row: Mapping[str, Any], column: str) -> Any:
    """row[a][b] for column "a.b" (verl's nested `extra_info.index`); None where a part is missing."""
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _example(row: Mapping[str, Any], columns: dict[str, str | None], spec: PromptSetSpec, number: int,
             at: str, known: set[str]) -> tuple[Example, str]:
    prompt_column, answer_column = columns["prompt"], columns["answer"]
    raw_prompt = lookup_column(row, prompt_column)
    if raw_prompt is None:
        raise PromptDataError(f"{at}: column {prompt_column!r} is missing")
    if isinstance(raw_prompt, str):
        history, prompt = (), raw_prompt
        if not prompt.strip():
            raise PromptDataError(f"{at}: column {prompt_column!r} is empty")
    else:
        try:
            history, prompt = parse_chat_turns(raw_prompt, f"column {prompt_column!r}")
        except ValueError as error:
            raise PromptDataError(f"{at}: {error}") from None
    answer = _answer(lookup_column(row, answer_column), at, answer_column)
    identifier = _text_or_int(row, columns["id"], at) or f"row-{number}"
    cluster = _text_or_int(row, columns["cluster"], at) or DEFAULT_CLUSTER
    verifier = _text_or_int(row, columns["verifier"], at) or spec.verifier
    if verifier is None:
        raise PromptDataError(f"{at}: no verifier: set data.prompts.verifier (the default, e.g. 'exact_match') or "
                              "a verifier column (columns.verifier)")
    if verifier not in known:
        raise PromptDataError(f"{at}: column {columns['verifier'] or 'verifier'!r} names an unknown verifier; "
                              f"known: {', '.join(sorted(known))}")
    metadata = lookup_column(row, columns["metadata"]) if columns["metadata"] else None
    if metadata is not None and not isinstance(metadata, Mapping):
        raise PromptDataError(f"{at}: column {columns['metadata']!r} must be an object, got "
                              f"{type(metadata).__name__}")
    example = Example(id=identifier, prompt=prompt, answer=answer, domain=cluster, verifier=verifier,
                      metadata=dict(metadata or {}), history=history)
    from rlvr_core.verifiers import get_verifier

    try:
        get_verifier(verifier).check_example(example)
    except ValueError as error:
        raise PromptDataError(f"{at}: column {answer_column!r}: verifier {verifier!r} cannot score this row "
                              f"({error})") from None
    return example, cluster


def _answer(value: Any, at: str, column: str) -> str:
    if value is None:
        raise PromptDataError(f"{at}: column {column!r} is missing")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise PromptDataError(f"{at}: column {column!r} must be text or a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise PromptDataError(f"{at}: column {column!r} must be a finite number")
    text = value if isinstance(value, str) else str(value)
    if not text.strip():
        raise PromptDataError(f"{at}: column {column!r} is empty")
    return text


def _text_or_int(row: Mapping[str, Any], column: str | None, at: str) -> str | None:
    if column is None:
        return None
    value = lookup_column(row, column)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise PromptDataError(f"{at}: column {column!r} must be text or an integer, got {type(value).__name__}")
    return str(value) if str(value).strip() else None


def _verifiers() -> set[str]:
    from rlvr_core.verifiers import verifier_names

    return set(verifier_names())
