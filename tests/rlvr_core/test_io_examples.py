"""read_examples / write_examples: round trips, and errors that name file, line and field but
never quote a row's content (held-out data is secret)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlvr_core.tasks.example import Example
from rlvr_core.tasks.io import ExampleFileError, read_examples, write_examples

SECRET = "SECRET-PROMPT-7f3a"


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _row(**fields) -> str:
    return json.dumps(fields)


def _error_for(path: Path) -> str:
    with pytest.raises(ExampleFileError) as caught:
        read_examples(path)
    message = str(caught.value)
    assert SECRET not in message, "an error message quoted row content"
    return message


def test_round_trip_keeps_every_field(tmp_path):
    examples = [
        Example("a", "What is 2+2?", "4", task="t", domain="add", verifier="math_verify", metadata={"k": [1, 2]}),
        Example("b", "Ünïcode prompt", "x y", domain="spell"),
    ]
    path = tmp_path / "out.jsonl"
    write_examples(path, examples)
    loaded = read_examples(path)
    assert [e.to_json() for e in loaded] == [e.to_json() for e in examples]
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"], "temporary file left behind"


def test_defaults_numbers_and_blank_lines(tmp_path):
    path = _write_lines(
        tmp_path / "d.jsonl",
        [_row(prompt="p1", answer=4), "", "   ", _row(prompt="p2", answer=2.5, id=7)],
    )
    first, second = read_examples(path)
    assert (first.id, first.answer, first.verifier, first.metadata) == ("row-1", "4", "exact_match", {})
    assert (second.id, second.answer) == ("7", "2.5")


def test_missing_answer_names_file_line_and_field(tmp_path):
    path = _write_lines(tmp_path / "heldout.jsonl", [_row(prompt="ok", answer="1"), _row(prompt=SECRET)])
    assert _error_for(path) == "heldout.jsonl line 2: field 'answer' is missing"


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"answer": "1"}, "field 'prompt' is missing"),
        ({"prompt": "   ", "answer": "1"}, "field 'prompt' is empty"),
        ({"prompt": SECRET, "answer": ""}, "field 'answer' is empty"),
        ({"prompt": SECRET, "answer": [SECRET]}, "field 'answer' must be a string or a number, got list"),
        ({"prompt": SECRET, "answer": True}, "field 'answer' must be a string or a number, got bool"),
        ({"prompt": 5, "answer": "1"}, "field 'prompt' must be a string, got int"),
        ({"prompt": SECRET, "answer": "1", "id": [1]}, "field 'id' must be a string or an integer"),
        ({"prompt": SECRET, "answer": "1", "domain": 3}, "field 'domain' must be a string, got int"),
        ({"prompt": SECRET, "answer": "1", "metadata": SECRET}, "field 'metadata' must be an object, got str"),
        ({"prompt": SECRET, "answers": "1"}, "unknown field(s) 'answers'"),
        ({"prompt": SECRET, "answer": "1", "verifier": "nope"}, "field 'verifier' names an unknown verifier"),
    ],
)
def test_invalid_fields(tmp_path, row, expected):
    path = _write_lines(tmp_path / "h.jsonl", [json.dumps(row)])
    message = _error_for(path)
    assert message.startswith("h.jsonl line 1: ")
    assert expected in message


def test_non_finite_answer_is_rejected(tmp_path):
    path = _write_lines(tmp_path / "h.jsonl", ['{"prompt": "p", "answer": NaN}'])
    assert "finite" in _error_for(path)


def test_unknown_verifier_is_allowed_when_not_checked(tmp_path):
    path = _write_lines(tmp_path / "h.jsonl", [_row(prompt="p", answer="1", verifier="custom")])
    assert read_examples(path, check_verifiers=False)[0].verifier == "custom"


def test_invalid_json_does_not_quote_the_line(tmp_path):
    path = _write_lines(tmp_path / "h.jsonl", [_row(prompt="p", answer="1"), '{"prompt": "' + SECRET + '", answer'])
    message = _error_for(path)
    assert message.startswith("h.jsonl line 2: invalid JSON")


def test_row_that_is_not_an_object(tmp_path):
    path = _write_lines(tmp_path / "h.jsonl", [json.dumps([SECRET, "1"])])
    assert _error_for(path) == "h.jsonl line 1: row must be a JSON object, got list"


def test_invalid_utf8(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_bytes(b'{"prompt": "\xff\xfe", "answer": "1"}\n')
    assert _error_for(path) == "h.jsonl line 1: not valid UTF-8"


def test_duplicate_ids_name_both_lines_not_the_id(tmp_path):
    path = _write_lines(
        tmp_path / "h.jsonl",
        [_row(prompt="a", answer="1", id=SECRET), _row(prompt="b", answer="2"), _row(prompt="c", answer="3", id=SECRET)],
    )
    assert _error_for(path) == "h.jsonl line 3: field 'id' duplicates the id on line 1"


def test_explicit_id_colliding_with_a_default_id(tmp_path):
    path = _write_lines(tmp_path / "h.jsonl", [_row(prompt="a", answer="1"), _row(prompt="b", answer="2", id="row-1")])
    assert "line 2: field 'id' duplicates the id on line 1" in _error_for(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "h.jsonl"
    path.write_text(content)
    assert _error_for(path) == "h.jsonl: file holds no examples"


def test_missing_file_and_bad_suffix(tmp_path):
    assert _error_for(tmp_path / "nope.jsonl") == "nope.jsonl: file not found"
    csv = tmp_path / "data.csv"
    csv.write_text("prompt,answer\n")
    assert "unsupported file type '.csv'" in _error_for(csv)


def test_write_refuses_parquet_suffix(tmp_path):
    with pytest.raises(ExampleFileError, match="writes JSONL"):
        write_examples(tmp_path / "x.parquet", [Example("a", "p", "1")])


def test_parquet_round_trip_and_row_errors(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"prompt": ["p1", "p2"], "answer": ["1", "2"], "domain": ["add", None]}), good)
    loaded = read_examples(good)
    assert [(e.id, e.prompt, e.answer, e.domain) for e in loaded] == [("row-1", "p1", "1", "add"), ("row-2", "p2", "2", "")]

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["p1", SECRET], "answer": ["1", None]}), bad)
    assert _error_for(bad) == "bad.parquet row 2: field 'answer' is missing"

    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not parquet " + SECRET.encode())
    assert _error_for(corrupt).startswith("corrupt.parquet: not a readable parquet file")


def test_parquet_without_pyarrow_gives_a_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "h.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert "reading parquet needs pyarrow" in _error_for(path)
