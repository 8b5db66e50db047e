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
    server -> worker   ("score", split, [(checkpoint_id, dir, {file: sha256}), ...], [row indices], decoding dict)
    worker -> server   ("ok", ndarray (num_candidates, num_rows)) | ("error", kind)
    server -> worker   ("differences", split, [(base), (candidate), ...], [row indices], decoding dict, metric, clip)
    worker -> server   ("ok", ndarray (num_candidates, num_rows)) | ("error", kind)
    server -> worker   ("probe", checkpoint_id, dir)      a dry run on public probe prompts
    worker -> server   ("ok", None) | ("error", kind)
    server -> worker   ("stop",)
"""

from __future__ import annotations

import os
import signal
import sys
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from protocol.adapter_rules import ADAPTER_FILES

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
    # The feedback split's verifier when it differs (config data.feedback_verifier): a name or an options table.
    feedback_verifier: str | Mapping[str, Any] = ""
    answer_template: str = " {answer}"  # data.answer_template: a reference answer as a completion
    teacher_forcing: bool = False  # the node serves difference releases: the dry run teacher-forces too

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
    """Loaded models, one per checkpoint STRUCTURE (structure_key: config, tokenizer, safetensors
    headers and sizes), LRU over `model_cache_size` structures.

    A candidate of a structure already in memory is not reloaded: only the safetensors files
    whose content differs from what the model holds (by sha256, `digests` from the store's
    manifest) are read, and their tensors copied in place. A query of a base and C candidates
    then loads each changed tensor once per candidate and builds one model and one engine, where
    `from_pretrained` per candidate rebuilt everything. In-place loading is used only where it
    provably gives what from_pretrained gives: at a structure's first (full) load, every stored
    tensor is checked to land on its own parameter with exactly the loaded value (no tied
    duplicate, no renamed key); a structure that fails that check is reloaded in full for each
    new checkpoint, as before.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._slots: OrderedDict[str, _Resident] = OrderedDict()
        self.full_loads = 0  # from_pretrained calls (tests and benchmarks read these)
        self.files_applied = 0  # safetensors files copied in place

    def get(self, checkpoint_id: str, directory: Path, digests: dict[str, str] | None = None) -> Any:
        """The engine of a checkpoint folder (the base weights, plus its LoRA adapter if it has one)."""
        directory = Path(directory)
        digests = dict(digests or {})
        names = sorted(p.name for p in directory.iterdir())
        base_files = [name for name in names if name not in ADAPTER_FILES]
        weights = [name for name in base_files if name.endswith(".safetensors")]
        structure = _structure_of(directory, base_files, digests)  # the base: adapters do not change it
        slot = self._slots.get(structure)
        if slot is not None:
            self._slots.move_to_end(structure)
            if slot.holds != checkpoint_id and slot.in_place:
                self._apply(slot, directory, weights, digests)
            elif slot.holds != checkpoint_id:
                slot = None  # this structure cannot be applied in place: a full load
        if slot is None:
            slot = self._load(directory, base_files, weights, digests)
            self._slots[structure] = slot
            self._slots.move_to_end(structure)
            while len(self._slots) > self.spec.model_cache_size:
                self._slots.popitem(last=False)
                if str(self.spec.device).startswith("cuda"):
                    import torch

                    torch.cuda.empty_cache()
        if slot.holds != checkpoint_id:
            slot.adapter.use(slot.model, directory if ADAPTER_FILES[0] in names else None, digests)
            slot.holds = checkpoint_id
        return slot.engine

    def _load(self, directory: Path, base_files: list[str], weights: list[str], digests: dict[str, str]) -> _Resident:
        from rlvr_core.engines.registry import build_engine
        from rlvr_core.models.loading import load_policy

        dtype = _torch_dtype(self.spec.dtype, self.spec.device)
        with _base_view(directory, base_files) as base:  # never a folder with adapter files: transformers
            model, tokenizer = load_policy(base, self.spec.device, dtype)  # would hand those to PEFT
        self.full_loads += 1
        # Every engine gets the same input: the owner's batch size reaches any engine as
        # FixedShape.batch_prompts on each generate call (evaluation_shape), never as an option.
        engine = build_engine(self.spec.engine, model, tokenizer, device=self.spec.device)
        targets = _in_place_targets(model, directory, weights)
        loaded = {name: digests.get(name) for name in weights}
        return _Resident(engine, model, targets, loaded, AppliedAdapter())

    def _apply(self, slot: _Resident, directory: Path, weights: list[str], digests: dict[str, str]) -> None:
        import torch
        from safetensors import safe_open

        changed = [name for name in weights if digests.get(name) is None or slot.loaded.get(name) != digests[name]]
        with torch.no_grad():
            for name in changed:
                slot.loaded[name] = None  # unknown until the copy completes
                with safe_open(str(directory / name), framework="pt", device="cpu") as handle:
                    for tensor_name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                        slot.targets[tensor_name].copy_(handle.get_tensor(tensor_name))
                slot.loaded[name] = digests.get(name)
                self.files_applied += 1
        sync = getattr(slot.engine, "sync_weights", None)
        if changed and sync is not None:
            sync()


class AppliedAdapter:
    """The LoRA adapter a resident model runs with, as forward hooks on its linear layers:
    out = W x + scale * B (A x), what PEFT computes, with the base weights untouched, so
    removing the hooks restores the base exactly (no subtract-back rounding). The adapter was
    validated at upload against the base's shapes (protocol.adapter_rules)."""

    def __init__(self) -> None:
        self.digest: str | None = None
        self._handles: list[Any] = []

    def use(self, model: Any, directory: Path | None, digests: dict[str, str]) -> None:
        """Run `model` with the adapter in `directory` (None: none)."""
        digest = None if directory is None else digests.get(ADAPTER_FILES[1])
        if directory is not None and digest is not None and digest == self.digest:
            return
        self.remove()
        if directory is None:
            return
        import torch
        from safetensors.torch import load_file

        from protocol.adapter_rules import parse_adapter_config

        config = parse_adapter_config((directory / ADAPTER_FILES[0]).read_bytes())
        rank, alpha = int(config["r"]), float(config["lora_alpha"])
        scale = alpha / (rank**0.5 if config.get("use_rslora", False) else rank)
        tensors = load_file(str(directory / ADAPTER_FILES[1]))
        prefix = "base_model.model."
        modules = sorted({name[len(prefix):].rsplit(".lora_", 1)[0] for name in tensors})
        for module_name in modules:
            module = model.get_submodule(module_name)
            if not isinstance(module, torch.nn.Linear):
                raise TypeError(f"adapter module {module_name} is not a linear layer")
            weight = module.weight
            down = tensors[f"{prefix}{module_name}.lora_A.weight"].to(weight.device, weight.dtype)  # (r, in)
            up = tensors[f"{prefix}{module_name}.lora_B.weight"].to(weight.device, weight.dtype)  # (out, r)
            self._handles.append(module.register_forward_hook(_lora_hook(down, up, scale)))
        self.digest = digest

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self.digest = [], None


def _lora_hook(down: Any, up: Any, scale: float):
    import torch.nn.functional as F

    def hook(module: Any, inputs: tuple, output: Any) -> Any:
        return output + F.linear(F.linear(inputs[0], down), up) * scale

    return hook


@dataclass
class _Resident:
    engine: Any
    model: Any
    targets: dict | None
    """Stored tensor name -> the model tensor it is copied into; None: in-place loading is off."""
    loaded: dict[str, str | None]
    """safetensors file -> sha256 of the content the model holds (None: unknown)."""
    adapter: AppliedAdapter
    holds: str = ""

    @property
    def in_place(self) -> bool:
        return self.targets is not None


@contextmanager
def _base_view(directory: Path, base_files: list[str]):
    """`directory`, or, when it holds adapter files too, a sibling folder of links to its base files."""
    if len(base_files) == len(list(directory.iterdir())):
        yield directory
        return
    import shutil
    import tempfile

    view = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}-base-"))
    try:
        for name in base_files:
            try:
                os.link(directory / name, view / name)
            except OSError:
                shutil.copyfile(directory / name, view / name)
        yield view
    finally:
        shutil.rmtree(view, ignore_errors=True)


def _structure_of(directory: Path, files: list[str], digests: dict[str, str]) -> str:
    """checkpoint_store.structure_key of some files of a folder; JSON files without a known
    digest are hashed."""
    import hashlib

    from target_owner_node.checkpoint_store import ManifestEntry, structure_key

    entries = []
    for path in (directory / name for name in files):
        digest = digests.get(path.name)
        if digest is None and not path.name.endswith(".safetensors"):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        entries.append(ManifestEntry(path.name, path.stat().st_size, digest or ""))
    return structure_key(entries, directory)


def _in_place_targets(model: Any, directory: Path, weights: list[str]) -> dict | None:
    """Stored tensor name -> model tensor, when copying the files in place reproduces exactly what
    from_pretrained loaded: each name is a state-dict entry of its own storage, of the same shape,
    holding the stored value cast to the model's dtype. None otherwise."""
    import torch
    from safetensors import safe_open

    state = model.state_dict()
    targets: dict[str, Any] = {}
    storages: set[int] = set()
    for name in weights:
        with safe_open(str(directory / name), framework="pt", device="cpu") as handle:
            for tensor_name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                target = state.get(tensor_name)
                if target is None or target.data_ptr() in storages:
                    return None  # a renamed key or a tied duplicate: from_pretrained decides, not a copy
                stored = handle.get_tensor(tensor_name)
                if stored.shape != target.shape or not torch.equal(stored.to(target.dtype), target):
                    return None
                storages.add(target.data_ptr())
                targets[tensor_name] = target
    return targets


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
    shape = evaluation_shape(spec, engine, max_new_tokens)
    generations = engine.generate(
        prompts,
        spec.max_samples_per_prompt,
        params,
        row_keys=list(range(len(prompts))),
        shape=shape,
    )
    if spec.teacher_forcing:  # a difference release teacher-forces samples and answers at the same shape
        samples = [[g.completion_ids for g in row] for row in generations]
        engine.completion_logprobs([row[0].prompt_ids for row in generations], samples, 1.0, max_new_tokens, shape)
        answers = engine.encode_completions(list(PROBE_TEXTS), max_new_tokens)
        engine.completion_logprobs(engine.encode_prompts(prompts[: len(answers)], max_new_tokens, shape),
                                   [[a] for a in answers], 1.0, max_new_tokens, shape)


@dataclass(frozen=True)
class Split:
    """One split's rows and each row's randomness key (from its stable id, never its position)."""

    examples: list
    keys: list[int]
    verifier: Any = None  # scores every row instead of its own (data.feedback_verifier), or None


def _load(path: Path, verifier: str, scored_by: str | Mapping[str, Any] = "") -> Split:
    from rlvr_core.engines.sampling import row_key
    from target_owner_node.heldout import load_split

    examples = load_split(path, verifier)
    override = None
    if scored_by:  # data.feedback_verifier: on top of each row's own (exact) verifier
        from rlvr_core.verifiers.base import make_verifier

        override = make_verifier(scored_by)
    return Split(examples, [row_key(example.id) for example in examples], override)


def worker_main(conn: Any, spec: WorkerSpec) -> None:
    """Entry point of the spawned process. Exits when told to stop or when the server is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server owns shutdown (Ctrl+C hits the group)
    if not str(spec.device).startswith("cuda"):
        import torch

        from rlvr_core.models.memory import keep_freed_memory

        # Small models on a shared CPU: spinning OpenMP threads are far slower than one
        # thread when the trainer runs beside us (rlvr_core/models/threads.py).
        torch.set_num_threads(1)
        keep_freed_memory()  # every batch reuses its buffers instead of faulting them in again

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
        elif message[0] == "differences":
            reply = _differences(cache, spec, splits, *message[1:])
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
        for position, (checkpoint_id, directory, *digests) in enumerate(checkpoints):
            stage = MODEL_LOAD_FAILED
            engine = cache.get(checkpoint_id, Path(directory), digests[0] if digests else None)
            stage = EVALUATION_FAILED
            scores[position] = score_split(engine, spec, splits[split], indices, decoding)
    except Exception as error:  # noqa: BLE001 - a failure no single row explains (score_rows confines those)
        _report(stage, error)
        return ("error", stage)
    return ("ok", scores)


def _differences(cache: ModelCache, spec: WorkerSpec, splits: dict, split: str, checkpoints, indices, decoding,
                 metric: str, clip: float) -> tuple:
    """Each candidate's clipped row differences from the base (checkpoints[0]): rlvr_core/differences.py."""
    from rlvr_core.differences import difference_metric, release_differences
    from rlvr_core.scoring import Decoding

    data = splits[split]
    settings = Decoding.from_json(decoding)
    stage = [MODEL_LOAD_FAILED]

    def load(checkpoint) -> Any:
        checkpoint_id, directory, *digests = checkpoint
        stage[0] = MODEL_LOAD_FAILED
        engine = cache.get(checkpoint_id, Path(directory), digests[0] if digests else None)
        stage[0] = EVALUATION_FAILED
        return engine

    try:
        base, *candidates = checkpoints
        shape = evaluation_shape(spec, load(base), settings.max_new_tokens)  # loading it again is free
        values = release_differences(
            load, base, candidates, difference_metric(metric), [data.examples[i] for i in indices], spec.rendering,
            settings, [data.keys[i] for i in indices], clip, shape=shape, verifier=data.verifier,
            answer_template=spec.answer_template,
        )
    except Exception as error:  # noqa: BLE001 - a failure no single row explains (rows are confined)
        _report(stage[0], error)
        return ("error", stage[0])
    return ("ok", values)


def _report(stage: str, error: Exception) -> None:
    # Only the exception TYPE goes to stderr: its text could quote a prompt or answer.
    print(f'{{"event": "worker_error", "stage": "{stage}", "type": "{type(error).__name__}"}}', file=sys.stderr)
