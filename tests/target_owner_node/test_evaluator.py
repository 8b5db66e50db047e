"""WorkerScorer's failure handling, with a light fake worker process (no model)."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from protocol import errors
from protocol.errors import ProtocolError
from target_owner_node.evaluate_request import Decoding
from target_owner_node.evaluator import WorkerScorer
from target_owner_node.worker import WorkerSpec

from .fake_worker import fake_worker, wrong_size_worker

SPEC = WorkerSpec(Path("h.jsonl"), None, "per_example", "{prompt}", "transformers", "cpu", "auto", 8, 1)
SIZES = {"feedback": 120, "test": 20}
CHECKPOINTS = [("a" * 64, Path("/nonexistent"))]


def _decoding(mode: int) -> Decoding:
    return Decoding(max_new_tokens=4, samples_per_prompt=1, temperature=0.0, seed=mode)


def _fails(scorer, mode, code) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        scorer.score("feedback", CHECKPOINTS, np.arange(5), _decoding(mode))
    assert caught.value.code == code and caught.value.reason == errors.EVALUATION_FAILED
    return caught.value


def test_crash_timeout_and_errors_are_generic_and_the_worker_comes_back():
    scorer = WorkerScorer(SPEC, timeout_s=1.0, expected_sizes=SIZES, target=fake_worker)
    try:
        assert scorer.score("feedback", CHECKPOINTS, np.arange(5), _decoding(1)).tolist() == [[0.5] * 5]
        assert scorer.score("feedback", CHECKPOINTS, np.arange(0), _decoding(3)).shape == (
            1,
            0,
        )  # nothing to score
        first = scorer._process.pid
        crash = _fails(scorer, 3, grpc.StatusCode.UNAVAILABLE)
        assert "stopped unexpectedly" in crash.message and "same request_id" in crash.message
        assert scorer.score("feedback", CHECKPOINTS, np.arange(5), _decoding(1)).shape == (1, 5)
        assert scorer._process.pid != first
        timeout = _fails(scorer, 2, grpc.StatusCode.UNAVAILABLE)
        assert "timed out" in timeout.message
        assert scorer.score("feedback", CHECKPOINTS, np.arange(2), _decoding(1)).shape == (1, 2)
        assert (
            _fails(scorer, 4, grpc.StatusCode.INTERNAL).message
            == "a checkpoint could not be loaded by the evaluator"
        )
        assert _fails(scorer, 5, grpc.StatusCode.INTERNAL).message == "the evaluation failed"
    finally:
        scorer.close()
    assert scorer._process is None


def test_worker_seeing_other_data_is_refused():
    scorer = WorkerScorer(SPEC, timeout_s=5.0, expected_sizes=SIZES, target=wrong_size_worker)
    try:
        with pytest.raises(ProtocolError) as caught:
            scorer.start()
        assert caught.value.code == grpc.StatusCode.INTERNAL and "changed" in caught.value.message
    finally:
        scorer.close()


def test_shutdown_does_not_wait_for_a_worker_still_starting():
    """The node warms its worker after SERVING (seconds of imports); a SIGTERM meanwhile ends
    that start at once instead of waiting for it (issue 14: prompt shutdown)."""
    import threading
    import time

    from tests.target_owner_node.fake_worker import slow_start_worker

    scorer = WorkerScorer(SPEC, timeout_s=5.0, expected_sizes=SIZES, target=slow_start_worker)
    outcome = []

    def warm():
        try:
            scorer.start()
            outcome.append("started")
        except ProtocolError as error:
            outcome.append(error.code)

    thread = threading.Thread(target=warm)
    thread.start()
    deadline = time.monotonic() + 30
    while scorer._starting is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert scorer._starting is not None, "the worker start never began"
    started = time.perf_counter()
    scorer.close()
    thread.join(timeout=10)
    assert time.perf_counter() - started < 3.0
    assert outcome == [grpc.StatusCode.UNAVAILABLE] and scorer._process is None
    scorer.start()  # after close a warm-up starts nothing
    assert scorer._process is None
