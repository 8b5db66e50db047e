"""The server's handle on the evaluation worker process (see worker.py).

`Scorer` is the one interface the release logic depends on: given checkpoint folders, row
indices of a split and decoding settings, return a (num_candidates, num_rows) array of
per-row scores in [0, 1]. `WorkerScorer` runs it in a long-lived spawned process,
restarts that process after a crash or timeout, and turns every failure into a
ProtocolError with a generic message.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc
import numpy as np

from protocol import errors
from protocol.errors import ProtocolError
from target_owner_node.evaluate_request import Decoding
from target_owner_node.logs import log_event
from target_owner_node.worker import MODEL_LOAD_FAILED, WorkerSpec, worker_main

WORKER_START_TIMEOUT_S = 600.0


class Scorer(Protocol):
    def score(
        self, split: str, checkpoints: Sequence[tuple[str, Path]], indices: np.ndarray, decoding: Decoding
    ) -> np.ndarray:
        """Per-row scores, shape (len(checkpoints), len(indices)), values in [0, 1]."""

    def differences(
        self, split: str, checkpoints: Sequence[tuple[str, Path]], indices: np.ndarray, decoding: Decoding,
        metric: str, clip: float,
    ) -> np.ndarray:
        """Per-row differences of checkpoints[1:] from checkpoints[0] (rlvr_core/differences.py),
        shape (len(checkpoints) - 1, len(indices)), values in [-clip, clip]."""

    def close(self) -> None: ...


def evaluation_failed(code: grpc.StatusCode, message: str) -> ProtocolError:
    return ProtocolError(code, errors.EVALUATION_FAILED, message)


class WorkerScorer:
    """Runs scoring in one spawned worker process; one evaluation at a time."""

    def __init__(
        self,
        spec: WorkerSpec,
        timeout_s: float,
        expected_sizes: dict[str, int],
        target: Callable[[Any, WorkerSpec], None] = worker_main,
    ) -> None:
        """`target` is the worker's entry point (a module-level function; tests pass a fake)."""
        self.spec = spec
        self.target = target
        self.timeout_s = timeout_s
        self.expected_sizes = expected_sizes
        self.file_digests: Callable[[str], dict[str, str]] | None = None
        """checkpoint id -> {file name: sha256} (the store's manifest, set by open_node): lets the
        worker apply only the files a candidate changed (worker.ModelCache)."""
        self._lock = threading.Lock()
        self._process = None
        self._conn = None
        self._starting = None  # the worker process while _ensure_started waits for its "ready"
        self._closed = False
        self._context = multiprocessing.get_context("spawn")

    def start(self) -> None:
        """Start the worker now (otherwise it starts on the first evaluation)."""
        with self._lock:
            if self._closed:
                return  # a warm-up that lost the race with shutdown starts nothing
            self._ensure_started()

    def _ensure_started(self) -> None:
        if self._process is not None and self._process.is_alive():
            return
        self._stop_process()
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=self.target, args=(child, self.spec), daemon=True, name="owner-eval"
        )
        process.start()
        child.close()
        self._process, self._conn = process, parent
        self._starting = process
        if self._closed:  # close() ran while the process was being launched
            process.kill()
        try:
            started = parent.poll(WORKER_START_TIMEOUT_S)
        finally:
            self._starting = None
        if not started:
            self._stop_process()
            raise evaluation_failed(
                grpc.StatusCode.UNAVAILABLE, "the evaluation worker did not start; retry later"
            )
        try:
            status, payload = parent.recv()
        except (EOFError, OSError):
            self._stop_process()
            raise evaluation_failed(
                grpc.StatusCode.UNAVAILABLE, "the evaluation worker did not start; retry later"
            )
        if status != "ready":
            self._stop_process()
            log_event("worker_failed", stage=str(payload))
            raise evaluation_failed(
                grpc.StatusCode.INTERNAL, "the evaluation worker could not load the owner's data"
            )
        sizes = {"feedback": payload["heldout_size"], "test": payload["test_size"]}
        if any(sizes[split] != size for split, size in self.expected_sizes.items()):
            self._stop_process()
            log_event("worker_failed", stage="data_changed")
            raise evaluation_failed(
                grpc.StatusCode.INTERNAL,
                "the owner's data changed since the node started; the owner must restart it",
            )
        log_event("worker_started", pid=process.pid)

    def score(
        self, split: str, checkpoints: Sequence[tuple[str, Path]], indices: np.ndarray, decoding: Decoding
    ) -> np.ndarray:
        if len(indices) == 0:
            return np.zeros((len(checkpoints), 0))
        request = ("score", split, self._checkpoints(checkpoints), [int(i) for i in indices], decoding.to_json())
        return np.clip(self._array(request, (len(checkpoints), len(indices))), 0.0, 1.0)

    def differences(
        self, split: str, checkpoints: Sequence[tuple[str, Path]], indices: np.ndarray, decoding: Decoding,
        metric: str, clip: float,
    ) -> np.ndarray:
        shape = (len(checkpoints) - 1, len(indices))
        if len(indices) == 0:
            return np.zeros(shape)
        request = ("differences", split, self._checkpoints(checkpoints), [int(i) for i in indices],
                   decoding.to_json(), str(metric), float(clip))
        return np.clip(self._array(request, shape), -clip, clip)

    def _checkpoints(self, checkpoints: Sequence[tuple[str, Path]]) -> list[tuple[str, str, dict[str, str]]]:
        return [(cid, str(path), self._digests(cid)) for cid, path in checkpoints]

    def _array(self, request: tuple, shape: tuple[int, int]) -> np.ndarray:
        """The worker's array for one request; any error, wrong shape or non-finite value is one generic error."""
        status, payload = self._call(request)
        if status != "ok":
            if payload == MODEL_LOAD_FAILED:
                raise evaluation_failed(
                    grpc.StatusCode.INTERNAL, "a checkpoint could not be loaded by the evaluator"
                )
            raise evaluation_failed(grpc.StatusCode.INTERNAL, "the evaluation failed")
        values = np.asarray(payload, dtype=np.float64)
        if values.shape != shape or not np.all(np.isfinite(values)):
            raise evaluation_failed(grpc.StatusCode.INTERNAL, "the evaluation failed")
        return values

    def _digests(self, checkpoint_id: str) -> dict[str, str]:
        return self.file_digests(checkpoint_id) if self.file_digests is not None else {}

    def probe(self, checkpoint_id: str, directory: Path) -> None:
        """Dry-run a new checkpoint on public probe prompts (upload time, before it is stored).

        Raises INVALID_ARGUMENT / INVALID_CHECKPOINT when the checkpoint cannot be loaded or
        cannot generate at the evaluation shape; UNAVAILABLE when the worker itself failed.
        """
        status, payload = self._call(("probe", checkpoint_id, str(directory)))
        if status != "ok":
            what = "could not be loaded" if payload == MODEL_LOAD_FAILED else "could not generate"
            raise ProtocolError(
                grpc.StatusCode.INVALID_ARGUMENT,
                errors.INVALID_CHECKPOINT,
                f"the checkpoint {what} in the owner's dry run on public probe prompts "
                "(transformers, safetensors, the owner's prompt width and decoding caps); "
                "check that it loads and generates with transformers locally",
            )

    def _call(self, request: tuple) -> tuple:
        """Send one request to the worker and wait for its reply (restarting a dead or hung worker)."""
        with self._lock:
            self._ensure_started()
            try:
                self._conn.send(request)
                ready = self._conn.poll(self.timeout_s)
                reply = self._conn.recv() if ready else None
            except (EOFError, OSError, BrokenPipeError):
                reply = None
                ready = True
            if reply is None:
                timed_out = not ready
                log_event("worker_restart", reason="timeout" if timed_out else "crash")
                self._stop_process()
                raise evaluation_failed(
                    grpc.StatusCode.UNAVAILABLE,
                    (
                        "the evaluation timed out"
                        if timed_out
                        else "the evaluation worker stopped unexpectedly"
                    )
                    + "; it was restarted. Retrying with the same request_id costs no extra privacy budget.",
                )
        return reply

    def _stop_process(self) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            try:
                conn.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
            conn.close()
        if process is not None:
            # The worker holds nothing to save: a short grace for the "stop" message, then
            # SIGTERM (a worker still importing torch at start would not read it for seconds).
            process.join(timeout=0.5)
            if process.is_alive():
                process.terminate()
                process.join(timeout=1)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the worker. An evaluation still running after `wait_s` is cut short (its
        caller gets UNAVAILABLE; a charged release stays retryable at no extra cost). A worker
        still starting (the warm-up after SERVING imports torch for seconds) is ended at once, so
        shutdown never waits for a start nobody needs any more."""
        self._closed = True
        deadline = time.monotonic() + wait_s
        acquired = False
        while not acquired and time.monotonic() < deadline:
            starting = self._starting
            if starting is not None and starting.is_alive():
                starting.kill()  # its pipe closes: the waiting start sees EOF and gives up
            acquired = self._lock.acquire(timeout=0.05)
        if acquired:
            try:
                self._stop_process()
            finally:
                self._lock.release()
        elif self._process is not None:
            self._process.kill()
