"""The evaluation worker: a separate (spawned) process that loads untrusted checkpoints,
generates completions for held-out prompts and verifies them.

Why a process: model loading and generation run code paths fed by untrusted files and can
crash or hang; the server process (which holds the TLS key, the ledger and the budget)
must survive that. The worker gets only what it needs: the data paths and engine settings
(`WorkerSpec`). It never sees keys or the ledger, and it reports back only a score array
or an error KIND (never an exception text, which could quote held-out data).

Protocol over a multiprocessing Pipe (all messages are tuples):
    worker -> server   ("ready", {"heldout_size": N, "test_size": T}) | ("error", kind)
    server -> worker   ("score", split, [(checkpoint_id, dir), ...], [row indices], decoding dict)
    worker -> server   ("ok", ndarray (num_candidates, num_rows)) | ("error", kind)
    server -> worker   ("stop",)
"""

from __future__ import annotations

import signal
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Error kinds the worker may report. The server maps them to generic messages.
DATA_UNREADABLE = "data_unreadable"
MODEL_LOAD_FAILED = "model_load_failed"
EVALUATION_FAILED = "evaluation_failed"


@dataclass(frozen=True)
class WorkerSpec:
    """Everything the worker process is given (picklable, no secrets)."""

    heldout_path: Path
    test_path: Path | None
    verifier: str
    prompt_template: str
    engine: str
    device: str
    dtype: str
    batch_size: int
    model_cache_size: int


class ModelCache:
    """A small LRU of loaded engines keyed by checkpoint id (ids are content hashes)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._engines: OrderedDict[str, Any] = OrderedDict()

    def get(self, checkpoint_id: str, directory: Path) -> Any:
        if checkpoint_id in self._engines:
            self._engines.move_to_end(checkpoint_id)
            return self._engines[checkpoint_id]
        import torch

        from rlvr_core.engines.registry import build_engine
        from rlvr_core.models.loading import load_policy

        dtype = _torch_dtype(self.spec.dtype, self.spec.device)
        model, tokenizer = load_policy(directory, self.spec.device, dtype)
        options = {"batch_size": self.spec.batch_size} if self.spec.engine == "transformers" else {}
        engine = build_engine(self.spec.engine, model, tokenizer, device=self.spec.device, **options)
        self._engines[checkpoint_id] = engine
        while len(self._engines) > self.spec.model_cache_size:
            self._engines.popitem(last=False)
            if str(self.spec.device).startswith("cuda"):
                torch.cuda.empty_cache()
        return engine


def _torch_dtype(name: str, device: str):
    import torch

    if name == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    return getattr(torch, name)


def score_rows(engine: Any, examples: list, prompt_template: str, decoding: dict[str, Any]) -> np.ndarray:
    """Mean verifier score over k samples for each example, clamped to [0, 1]. Shape (m,)."""
    from rlvr_core.engines.base import SamplingParams
    from rlvr_core.tasks.prompting import render_prompt
    from rlvr_core.verifiers import score_example

    if not examples:
        return np.zeros(0)
    prompts = [render_prompt(example.prompt, prompt_template) for example in examples]
    params = SamplingParams(
        max_new_tokens=int(decoding["max_new_tokens"]),
        temperature=float(decoding["temperature"]),
        top_p=1.0,
        seed=int(decoding["seed"]),
    )
    # One call for all rows: the engine chunks internally and its random numbers depend only on
    # (seed, prompts), so every candidate of a query sees identical sampling noise.
    generations = engine.generate(prompts, int(decoding["samples_per_prompt"]), params)
    scores = np.zeros(len(examples))
    for row, (example, samples) in enumerate(zip(examples, generations)):
        values = [float(score_example(sample.text, example)) for sample in samples]
        values = [min(1.0, max(0.0, v)) if np.isfinite(v) else 0.0 for v in values]
        scores[row] = sum(values) / len(values)
    return scores


def worker_main(conn: Any, spec: WorkerSpec) -> None:
    """Entry point of the spawned process. Exits when told to stop or when the server is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server owns shutdown (Ctrl+C hits the group)
    from target_owner_node.heldout import load_split

    if not str(spec.device).startswith("cuda"):
        import torch

        # Small models on a shared CPU: spinning OpenMP threads are far slower than one
        # thread when the trainer runs beside us (rlvr_core/models/threads.py).
        torch.set_num_threads(1)

    try:
        splits = {"feedback": load_split(spec.heldout_path, spec.verifier)}
        if spec.test_path is not None:
            splits["test"] = load_split(spec.test_path, spec.verifier)
    except Exception:  # noqa: BLE001 - reported as a kind; the text could quote data
        conn.send(("error", DATA_UNREADABLE))
        return
    conn.send(("ready", {"heldout_size": len(splits["feedback"]), "test_size": len(splits.get("test", ()))}))
    cache = ModelCache(spec)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the server process is gone
        if message[0] == "stop":
            return
        _, split, checkpoints, indices, decoding = message
        examples = [splits[split][i] for i in indices]
        scores = np.zeros((len(checkpoints), len(examples)))
        stage = MODEL_LOAD_FAILED
        try:
            for position, (checkpoint_id, directory) in enumerate(checkpoints):
                stage = MODEL_LOAD_FAILED
                engine = cache.get(checkpoint_id, Path(directory))
                stage = EVALUATION_FAILED
                scores[position] = score_rows(engine, examples, spec.prompt_template, decoding)
        except Exception as error:  # noqa: BLE001 - any failure of untrusted-model code
            # Only the exception TYPE goes to stderr: its text could quote a prompt or answer.
            print(
                f'{{"event": "worker_error", "stage": "{stage}", "type": "{type(error).__name__}"}}',
                file=sys.stderr,
            )
            reply = ("error", stage)
        else:
            reply = ("ok", scores)
        try:
            conn.send(reply)
        except OSError:
            return  # the server process is gone
