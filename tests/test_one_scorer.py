"""Both parties score a prompt through ONE function: rlvr_core.scoring.score_rows.

The owner's evaluation worker and the trainer's local evaluation must score a row identically
(same rendering, same per-row randomness, same verifier clamp), so both call score_rows; a
second, private copy of render -> generate -> score would drift."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import rlvr_core.scoring
from rlvr_core.engines.base import FixedShape
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.rendering import Rendering

EXAMPLES = [Example(id=f"r{i}", prompt=f"{i}+1=", answer=str(i + 1)) for i in range(3)]


def _recording(monkeypatch, module, attribute):
    calls = []

    def record(engine, examples, template, decoding, row_keys, shape=None, **kwargs):
        calls.append((len(examples), list(row_keys), shape))
        return np.zeros(len(examples))

    monkeypatch.setattr(module, attribute, record)
    return calls


def test_owner_worker_and_trainer_evaluation_call_the_same_scorer(monkeypatch):
    from rlvr_core.engines.sampling import row_key
    from target_owner_node import worker
    from trainer_node import evaluation

    assert evaluation.score_rows is rlvr_core.scoring.score_rows
    owner_calls = _recording(monkeypatch, rlvr_core.scoring, "score_rows")  # the worker imports it at call time
    monkeypatch.setattr(worker, "evaluation_shape", lambda spec, engine, tokens: FixedShape(16, 4))
    spec = SimpleNamespace(rendering=Rendering("{prompt}"))
    split = worker.Split(EXAMPLES, [row_key(e.id) for e in EXAMPLES])
    decoding = {"max_new_tokens": 2, "samples_per_prompt": 1, "temperature": 0.0, "seed": 0}
    worker.score_split(object(), spec, split, [2, 0], decoding)
    assert owner_calls == [(2, [row_key("r2"), row_key("r0")], FixedShape(16, 4))]

    trainer_calls = _recording(monkeypatch, evaluation, "score_rows")
    evaluation.local_accuracy(object(), EXAMPLES, "{prompt}", max_new_tokens=2)
    assert trainer_calls and trainer_calls[0][1] == [row_key(e.id) for e in EXAMPLES]
