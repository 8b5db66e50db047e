"""The evaluation worker: a separate (spawned) process that loads untrusted checkpoints,
generates completions for held-out prompts and verifies them.

Why a process: model loading and generation run code paths fed by untrusted files and can
crash or hang; the server process (which holds the TLS key, the ledger and the budget)
must survive that. The worker gets only what it needs: the data paths and engine settings
(`WorkerSpec`). It never sees keys or the ledger, and it reports back only a score array
or an error KIND (never an exception text, which could quote held-out data).

Every evaluation runs with fixed shapes (`rlvr_core.engines.base.FixedShape`): each prompt
is left-padded or truncated to the public `max_prompt_tokens`, every batch is full, every row
decodes exactly max_new_tokens steps. Each row's randomness comes from (seed, the row's
stable id, sample index). So a row's score depends on nothing but the row itself, and time
and memory depend on nothing but public sizes (docs/PRIVACY.md, "Side channels").

Protocol over a multiprocessing Pipe (all messages are tuples):
    worker -> server   ("ready", {"heldout_size": N, "test_size": T}) | ("error", kind)
    server -> worker   ("score", split, [(checkpoint_id, dir), ...], [row indices], decoding dict)
    worker -> server   ("ok", ndarray (num_candidates, num_rows)) | ("error", kind)
    server -> worker   ("probe", checkpoint_id, dir)      a dry run on public probe prompts
    worker -> server   ("ok", None) | ("error", kind)
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
    max_prompt_tokens: int = 128
    max_new_tokens: int = 64  # the owner's caps: a dry run exercises the largest shape a query may ask
    max_samples_per_prompt: int = 8
    task_description: str = ""
    chat_template: str = ""  # the owner's chosen chat template (config data.chat_format / chat_template_path)
    chat_format: str = ""
    feedback_verifier: str = ""  # the feedback split's verifier when it differs (config data.feedback_verifier)

    @property
    def rendering(self):
        """How held-out prompts become model input: the owner's config, never the upload's."""
        from rlvr_core.tasks.rendering import Rendering

        return Rendering(self.prompt_template, self.chat_template, self.chat_format)


# Public text the dry run feeds every new checkpoint: the printable ASCII range, digits,
# a few non-ASCII scripts and emoji, an empty prompt and one far longer than any prompt
# width, so that tokenizing, truncating, padding and decoding all run before a charge.
PROBE_TEXTS: tuple[str, ...] = (
    "",
    "".join(chr(c) for c in range(32, 127)),
    "0123456789 + - * / = ( ) 42",
    "Ünïcödé – naïve café, Ελληνικά, русский, 数学, العربية, हिन्दी, 🙂🚀✓",
    "\t tabs\tand\nnew lines\n\n",
    "How many times does the letter r appear in the text 'a rare berry'? " * 64,
)


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
        # Every engine gets the same input: the owner's batch size reaches any engine as
        # FixedShape.batch_prompts on each generate call (evaluation_shape), never as an option.
        engine = build_engine(self.spec.engine, model, tokenizer, device=self.spec.device)
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


def evaluation_shape(spec: WorkerSpec, engine: Any, max_new_tokens: int):
    """The fixed shape of every batch: the public prompt width (cut to the model's context, a
    public fact of the checkpoint the server checked before charging) and full batches."""
    from rlvr_core.engines.base import FixedShape
    from rlvr_core.engines.transformers_engine import max_positions

    width = min(spec.max_prompt_tokens, max_positions(engine.model) - max_new_tokens)
    return FixedShape(prompt_tokens=width, batch_prompts=spec.batch_size)


def score_split(engine: Any, spec: WorkerSpec, split: Split, indices: list[int], decoding: dict) -> np.ndarray:
    """Scores of the rows `indices` of a split, shape (len(indices),), through the shared scorer."""
    from rlvr_core.scoring import Decoding, score_rows

    settings = Decoding.from_json(decoding)
    return score_rows(
        engine,
        [split.examples[i] for i in indices],
        spec.rendering,
        settings,
        row_keys=[split.keys[i] for i in indices],
        shape=evaluation_shape(spec, engine, settings.max_new_tokens),
        verifier=split.verifier,
    )


def dry_run(engine: Any, spec: WorkerSpec) -> None:
    """Generate for the public probe prompts at the largest shape a query may ask for.

    Raises whatever the checkpoint raises; nothing here touches held-out data, so a refusal
    at upload reveals nothing, and a checkpoint that passes has run every code path an
    evaluation runs (tokenize, pad, forward, sample, decode) at the same batch shape.
    """
    from rlvr_core.engines.base import SamplingParams
    from rlvr_core.engines.transformers_engine import max_positions

    max_new_tokens = max(1, min(spec.max_new_tokens, max_positions(engine.model) - 1))
    rendering = spec.rendering
    prompts = [rendering.render(text) for text in PROBE_TEXTS]
    prompts += [spec.task_description] if spec.task_description else []
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, seed=0)
    engine.generate(
        prompts,
        spec.max_samples_per_prompt,
        params,
        row_keys=list(range(len(prompts))),
        shape=evaluation_shape(spec, engine, max_new_tokens),
    )


@dataclass(frozen=True)
class Split:
    """One split's rows and each row's randomness key (from its stable id, never its position)."""

    examples: list
    keys: list[int]
    verifier: Any = None  # scores every row instead of its own (data.feedback_verifier), or None


def _load(path: Path, verifier: str, scored_by: str = "") -> Split:
    from rlvr_core.engines.sampling import row_key
    from target_owner_node.heldout import load_split

    examples = load_split(path, verifier)
    override = None
    if scored_by:  # data.feedback_verifier: on top of each row's own (exact) verifier
        from rlvr_core.verifiers.base import get_verifier

        override = get_verifier(scored_by)
    return Split(examples, [row_key(example.id) for example in examples], override)


def worker_main(conn: Any, spec: WorkerSpec) -> None:
    """Entry point of the spawned process. Exits when told to stop or when the server is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server owns shutdown (Ctrl+C hits the group)
    if not str(spec.device).startswith("cuda"):
        import torch

        # Small models on a shared CPU: spinning OpenMP threads are far slower than one
        # thread when the trainer runs beside us (rlvr_core/models/threads.py).
        torch.set_num_threads(1)

    try:
        splits = {"feedback": _load(spec.heldout_path, spec.verifier, spec.feedback_verifier)}
        if spec.test_path is not None:
            splits["test"] = _load(spec.test_path, spec.verifier)
    except Exception:  # noqa: BLE001 - reported as a kind; the text could quote data
        conn.send(("error", DATA_UNREADABLE))
        return
    test = splits.get("test", Split([], []))
    conn.send(("ready", {"heldout_size": len(splits["feedback"].examples), "test_size": len(test.examples)}))
    cache = ModelCache(spec)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the server process is gone
        if message[0] == "stop":
            return
        if message[0] == "probe":
            reply = _probe(cache, spec, *message[1:])
        else:
            reply = _score(cache, spec, splits, *message[1:])
        try:
            conn.send(reply)
        except OSError:
            return  # the server process is gone


def _probe(cache: ModelCache, spec: WorkerSpec, checkpoint_id: str, directory: str) -> tuple:
    stage = MODEL_LOAD_FAILED
    try:
        engine = cache.get(checkpoint_id, Path(directory))
        stage = EVALUATION_FAILED
        dry_run(engine, spec)
    except Exception as error:  # noqa: BLE001 - any failure of untrusted-model code
        _report(stage, error)
        return ("error", stage)
    return ("ok", None)


def _score(cache: ModelCache, spec: WorkerSpec, splits: dict, split: str, checkpoints, indices, decoding) -> tuple:
    scores = np.zeros((len(checkpoints), len(indices)))
    stage = MODEL_LOAD_FAILED
    try:
        for position, (checkpoint_id, directory) in enumerate(checkpoints):
            stage = MODEL_LOAD_FAILED
            engine = cache.get(checkpoint_id, Path(directory))
            stage = EVALUATION_FAILED
            scores[position] = score_split(engine, spec, splits[split], indices, decoding)
    except Exception as error:  # noqa: BLE001 - a failure no single row explains (score_rows confines those)
        _report(stage, error)
        return ("error", stage)
    return ("ok", scores)


def _report(stage: str, error: Exception) -> None:
    # Only the exception TYPE goes to stderr: its text could quote a prompt or answer.
    print(f'{{"event": "worker_error", "stage": "{stage}", "type": "{type(error).__name__}"}}', file=sys.stderr)
