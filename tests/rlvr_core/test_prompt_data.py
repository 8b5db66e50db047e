"""A trainer's own prompt set (rlvr_core/tasks/prompt_data.py): JSONL, Parquet, a `datasets` folder and
verl's RL parquet, with configurable columns; every bad row is named by file, row and column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr_core.tasks.prompt_data import PromptDataError, PromptSetSpec, read_prompt_set

pa = pytest.importorskip("pyarrow")
parquet = pytest.importorskip("pyarrow.parquet")

ROWS = [
    {"question": f"What is {i} plus {i + 1}?", "solution": 2 * i + 1, "topic": "add" if i % 2 else "sum"}
    for i in range(6)
]


def spec(path: Path, **fields) -> PromptSetSpec:
    return PromptSetSpec.model_validate({"path": str(path), **fields})


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def verl_rows(n: int = 5) -> list[dict]:
    """verl's RL layout (its examples/data_preprocess scripts): chat-message prompt, reward_model.ground_truth."""
    return [
        {
            "data_source": "openai/gsm8k" if i % 2 else "math",
            "prompt": [{"role": "system", "content": "Answer with a number."},
                       {"role": "user", "content": f"What is {i} times 2?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(n)
    ]


def test_jsonl_with_configured_columns(tmp_path):
    prompts = read_prompt_set(spec(write_jsonl(tmp_path / "p.jsonl", ROWS), verifier="exact_match",
                                   columns={"prompt": "question", "answer": "solution", "cluster": "topic"}))
    assert [e.prompt for e in prompts.examples] == [r["question"] for r in ROWS]
    assert prompts.examples[1].answer == "3" and prompts.examples[0].id == "row-1"
    assert prompts.clusters == ("sum", "add", "sum", "add", "sum", "add")
    assert {e.verifier for e in prompts.examples} == {"exact_match"}


def test_parquet_with_chat_message_prompts(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"{i}+1?"}], "answer": str(i + 1), "id": f"q{i}"} for i in range(4)]
    path = tmp_path / "p.parquet"
    parquet.write_table(pa.Table.from_pylist(rows), path)
    prompts = read_prompt_set(spec(path, verifier="exact_match"))
    assert [e.id for e in prompts.examples] == ["q0", "q1", "q2", "q3"]
    assert prompts.examples[2].prompt == "2+1?" and prompts.examples[2].history == ()
    assert set(prompts.clusters) == {"all"}


def test_verl_parquet_is_recognised(tmp_path):
    path = tmp_path / "train.parquet"
    parquet.write_table(pa.Table.from_pylist(verl_rows()), path)
    for fmt in ("auto", "verl"):
        prompts = read_prompt_set(spec(path, format=fmt, verifier="exact_match"))
        first = prompts.examples[1]
        assert first.prompt == "What is 1 times 2?" and first.answer == "2" and first.id == "1"
        assert first.history == (("system", "Answer with a number."),)
        assert first.metadata["split"] == "train"
        assert prompts.clusters[:2] == ("math", "openai/gsm8k")


def test_a_datasets_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:4]),
                          "test": datasets.Dataset.from_list(ROWS[4:])}).save_to_disk(str(folder))
    columns = {"prompt": "question", "answer": "solution"}
    train = read_prompt_set(spec(folder, verifier="exact_match", columns=columns))
    assert len(train.examples) == 4
    test = read_prompt_set(spec(folder, verifier="exact_match", columns=columns, split="test"))
    assert len(test.examples) == 2
    with pytest.raises(PromptDataError, match="data.prompts.split.*test, train"):
        read_prompt_set(spec(folder, verifier="exact_match", columns=columns, split="validation"))


@pytest.mark.parametrize(
    ("rows", "fields", "message"),
    [
        ([{"prompt": "a"}], {"verifier": "exact_match"}, r"p.jsonl line 1: column 'answer' is missing"),
        ([{"prompt": "a", "answer": "1"}, {"prompt": "", "answer": "2"}], {"verifier": "exact_match"},
         r"line 2: column 'prompt' is empty"),
        ([{"prompt": [{"role": "assistant", "content": "x"}], "answer": "1"}], {"verifier": "exact_match"},
         r"line 1: column 'prompt': the last message must be the user's"),
        ([{"prompt": "a", "answer": "1"}], {}, r"line 1: no verifier: set data.prompts.verifier"),
        ([{"prompt": "a", "answer": "1", "verifier": "nope"}], {}, r"line 1: column 'verifier' names an unknown"),
        ([{"prompt": "a", "answer": "1", "id": "x"}, {"prompt": "b", "answer": "2", "id": "x"}],
         {"verifier": "exact_match"}, r"line 2: column 'id' duplicates the id of line 1"),
        ([{"prompt": "a", "answer": [1, 2]}], {"verifier": "exact_match"}, r"column 'answer' must be text or a number"),
        ([{"prompt": "a", "answer": "two\nlines"}], {"verifier": "exact_match"},
         r"line 1: column 'answer': verifier 'exact_match' cannot score this row"),
        ([{"prompt": "a", "answer": "1", "metadata": [1]}], {"verifier": "exact_match"},
         r"column 'metadata' must be an object"),
    ],
)
def test_bad_rows_are_named_by_file_row_and_column(tmp_path, rows, fields, message):
    with pytest.raises(PromptDataError, match=message):
        read_prompt_set(spec(write_jsonl(tmp_path / "p.jsonl", rows), **fields))


def test_errors_never_quote_a_value(tmp_path):
    secret = "SECRET-VALUE-42"
    with pytest.raises(PromptDataError) as info:
        read_prompt_set(spec(write_jsonl(tmp_path / "p.jsonl", [{"prompt": secret, "answer": f"{secret}\nx"}]),
                             verifier="exact_match"))
    assert secret not in str(info.value)


def test_the_spec_refuses_unknown_keys_and_verifiers(tmp_path):
    with pytest.raises(ValueError, match="columns"):
        spec(tmp_path / "p.jsonl", columns={"questoin": "q"})
    with pytest.raises(ValueError, match="unknown verifier 'nope'"):
        spec(tmp_path / "p.jsonl", verifier="nope")
    with pytest.raises(PromptDataError, match="file not found"):
        read_prompt_set(spec(tmp_path / "missing.jsonl", verifier="exact_match"))
