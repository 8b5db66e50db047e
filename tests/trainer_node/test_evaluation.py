"""local_accuracy: scored by rlvr_core.scoring.score_rows, rows keyed by example id."""

from __future__ import annotations

import math

import pytest

from rlvr_core.engines.transformers_engine import TransformersEngine
from rlvr_core.models import load_policy, random_tiny_policy
from rlvr_core.tasks.example import Example
from trainer_node.evaluation import flatten_accuracy, local_accuracy

TEMPLATE = "Question: {prompt}\nAnswer:"
EXAMPLES = [
    Example(id=f"e{i}", prompt=f"Calculate {i} + 1.", answer=str(i + 1), domain="add" if i % 2 else "sum")
    for i in range(6)
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> TransformersEngine:
    texts = [f"Question: Calculate {i} + 1.\nAnswer: {i + 1}" for i in range(20)]
    path = random_tiny_policy(tmp_path_factory.mktemp("eval") / "model", texts, max_position=48)
    return TransformersEngine(*load_policy(path), num_threads=1)


def test_result_shape_and_chunking_does_not_matter(engine: TransformersEngine) -> None:
    def score(text: str, example: Example) -> float:
        return (len(text) % 5) / 4  # graded, so a changed sample changes the mean

    whole = local_accuracy(engine, EXAMPLES, TEMPLATE, 4, samples=3, seed=2, temperature=1.0, score=score)
    chunked = local_accuracy(engine, EXAMPLES, TEMPLATE, 4, samples=3, seed=2, temperature=1.0, score=score,
                             chunk_size=4)
    assert whole == chunked
    assert whole["n"] == 6 and whole["samples"] == 3 and set(whole["per_domain"]) == {"add", "sum"}
    assert set(flatten_accuracy(whole)) == {"accuracy", "accuracy/add", "accuracy/sum"}
    assert math.isnan(local_accuracy(engine, [], TEMPLATE, 4)["accuracy"])
