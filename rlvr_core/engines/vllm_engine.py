"""vLLM generation engine for GPU runs (name "vllm").

UNVERIFIED: written against vLLM's documented API (LLM, SamplingParams, LLM.generate,
LLM.collective_rpc); vLLM cannot be installed on this project's test machine nor on the lent
GPU machine, so no line below the import guard has run against a real vLLM. CPU tests drive it
with a fake `LLM` that has vLLM's method signatures (tests/rlvr_core/test_engines_vllm.py).
Install with the `gpu` extra (`pip install -e .[gpu]`) and expect to adjust details.

Design:
- Options (`VLLMEngineOptions`): model_path, gpu_memory_utilization, dtype, weight_bucket_mb and `llm_args`,
  further vllm.LLM keyword arguments (never the ones this engine sets itself, such as
  trust_remote_code or load_format).
- vLLM loads the checkpoint itself from a local directory (`model_path` option, else the
  directory the live model was loaded from), with load_format="safetensors" and
  trust_remote_code=False, like rlvr_core.models.load_policy. The directory is checked with
  check_model_dir first.
- Prompts go in as token ids, encoded and left-truncated exactly like TransformersEngine.
- Randomness: each prompt's request gets its own SamplingParams.seed,
  `sampling.row_seed(params.seed, row key)` (positional keys when row_keys is None), the same
  rule as TransformersEngine: a row's stream depends only on (seed, row key), and two
  checkpoints evaluated with one seed draw the same per-request streams. vLLM's sampler is not
  the one in sampling.py, so samples differ from TransformersEngine's for the same seed.
- A prompt that cannot be encoded (empty, tokenizer failure, id outside the vocabulary) gets
  placeholder generations (Generation.encoded False), as in TransformersEngine; with a
  FixedShape its request is replaced by a one-token dummy so the work does not depend on it.
- With a FixedShape, prompts are left-truncated to shape.prompt_tokens, requests are padded
  with dummies to a multiple of shape.batch_prompts, and every request decodes all
  max_new_tokens (ignore_eos, min_tokens); ids are cut after the first EOS here. vLLM has no
  fixed padded batches: its continuous batching and kernels do NOT make a row's floats
  independent of its batch-mates, so exact add-one-row invariance is not guaranteed with
  this engine (use "transformers" for DP evaluation, or check vLLM's batch-invariant mode).
- sync_weights() pushes the trainer's live parameters into every vLLM worker after each
  optimizer step on vLLM's supported path, `LLM.collective_rpc(callable, args=...)`: the
  module-level `load_weights_on_worker` runs inside each worker (in-process, multi-process or
  ray executor alike) and hands a bucket of (name, CPU tensor) pairs to the worker model's own
  `load_weights`, which shards them for tensor parallelism and fuses qkv/gate-up. Buckets of at
  most `weight_bucket_mb` keep a 1.5B-parameter push (3 GB in bf16) from being one message.
  Then the prefix cache is reset so no KV block computed with the old weights is reused. The
  earlier path through `llm.llm_engine.model_executor.driver_worker.model_runner.model` exists
  only when the worker lives in this process, which current multi-process vLLM does not do.
  Cost: each push copies the weights device -> host -> worker device and serializes them; vLLM's
  docs recommend collective_rpc for control messages and a separate data plane (its NCCL weight
  transfer, CUDA IPC) for tensors, which would avoid the host hop and is not used here. The callable travels by reference
  (cloudpickle): the workers must import this project (same environment, PYTHONPATH).
- Version range (pyproject `gpu` extra): vLLM 0.27.0-0.32.0, the releases whose wheels pin
  torch==2.13.0, the torch this project pins (0.22-0.26 pin 2.11.0, 0.33 pins 2.14.0; read from
  the registry's metadata). Within that range `LLM.collective_rpc(method, timeout=None, args=(),
  kwargs=None)`, `LLM.generate(prompts, sampling_params, use_tqdm=...)`, `LLM.reset_prefix_cache()`
  and `SamplingParams(n, temperature, top_p, max_tokens, seed, ...)` are the documented API this
  file uses. With n > 1, vLLM V1 runs sample i of a seeded request as a child request with seed
  `seed + i` (vllm/v1/engine/parallel_sampling.py), so sample i of a row depends only on
  (seed, row key, i) (read, not run).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, field_validator

from rlvr_core.configuration import OptionsSection
from rlvr_core.engines.base import FixedShape, Generation, GenerationEngine, SamplingParams, prompt_budget
from rlvr_core.engines.registry import ENGINES
from rlvr_core.engines.sampling import resolve_row_keys, row_seed, validate_params
from rlvr_core.engines.transformers_engine import max_positions
from rlvr_core.models.loading import check_model_dir

VLLM_MISSING_MESSAGE = (
    "the 'vllm' engine needs vLLM, which is not installed; install the gpu extra "
    "(pip install -e '.[gpu]') on a CUDA machine, or use engine 'transformers'"
)


def vllm_available() -> bool:
    """True when the vllm package can be imported (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


# vllm.LLM arguments the engine sets itself: safety (safetensors only, no remote code) and the
# row-seed and context rules depend on them, so `llm_args` may not override them.
RESERVED_LLM_ARGS = frozenset({"model", "tokenizer", "load_format", "trust_remote_code", "dtype", "seed",
                               "gpu_memory_utilization", "max_model_len"})


class VLLMEngineOptions(OptionsSection):
    """Options of the "vllm" engine (a trainer's `[rollout.options]`)."""

    model_path: str | None = Field(
        default=None, description="Local checkpoint directory vLLM loads; None = the live model's directory."
    )
    gpu_memory_utilization: float = Field(
        default=0.3, gt=0, le=1, description="Share of GPU memory vLLM may take (the trainer needs the rest)."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Weights dtype."
    )
    llm_args: dict[str, Any] = Field(
        default_factory=dict, description="Further vllm.LLM keyword arguments, passed through (vLLM checks "
        "them)."
    )
    weight_bucket_mb: int = Field(
        default=512, ge=1, le=65536, description="Largest weight push message (MiB); one collective_rpc per bucket."
    )

    @field_validator("llm_args")
    @classmethod
    def _not_reserved(cls, args: dict[str, Any]) -> dict[str, Any]:
        reserved = sorted(RESERVED_LLM_ARGS & set(args))
        if reserved:
            raise ValueError(f"{', '.join(reserved)} are set by the engine itself; remove them "
                             "(model_path, gpu_memory_utilization and dtype are options of their own)")
        return args


@ENGINES.register("vllm", options=VLLMEngineOptions)
class VLLMEngine(GenerationEngine):
    """Colocated vLLM engine; see the module docstring (unverified)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str = "cuda",
        model_path: str | Path | None = None,
        gpu_memory_utilization: float = 0.3,
        dtype: str = "bfloat16",
        llm_args: dict[str, Any] | None = None,
        weight_bucket_mb: int = 512,
    ) -> None:
        if not vllm_available():
            raise RuntimeError(VLLM_MISSING_MESSAGE)
        if not str(device).startswith("cuda"):
            raise ValueError(f"the 'vllm' engine runs on CUDA only, got device={device!r}")
        import vllm

        path = Path(model_path or getattr(model.config, "_name_or_path", "") or "")
        if not path.is_dir():
            raise ValueError("the 'vllm' engine needs model_path: a local checkpoint directory")
        check_model_dir(path)
        self._vllm = vllm
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.vocab_rows = int(model.get_input_embeddings().num_embeddings)
        self.push_dtype = PUSH_DTYPES.get(dtype)
        self.bucket_bytes = VLLMEngineOptions(weight_bucket_mb=weight_bucket_mb).weight_bucket_mb * 2**20
        self.llm = vllm.LLM(
            model=str(path.resolve()),
            tokenizer=str(path.resolve()),
            load_format="safetensors",
            trust_remote_code=False,
            dtype=dtype,
            seed=0,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_positions(model),
            **VLLMEngineOptions(llm_args=dict(llm_args or {})).llm_args,  # reserved keys refused
        )

    def generate(
        self,
        prompts: list[str],
        num_samples: int,
        params: SamplingParams,
        row_keys: Sequence[int] | None = None,
        shape: FixedShape | None = None,
    ) -> list[list[Generation]]:
        validate_params(params, num_samples)
        keys = resolve_row_keys(row_keys, len(prompts))
        positions = max_positions(self.model)
        if shape is not None:
            shape.check_fits(params.max_new_tokens, positions)
            room = shape.prompt_tokens
        else:
            room = positions - params.max_new_tokens
            if room < 1:
                raise ValueError(f"params.max_new_tokens ({params.max_new_tokens}) leaves no room for a prompt")
        if not prompts:
            return []
        prompt_ids = [self._encode(prompt, room) for prompt in prompts]
        slots = [(ids, key) for ids, key in zip(prompt_ids, keys) if ids or shape is not None]
        if shape is not None:  # dummies: a fixed number of requests, whatever the data
            slots += [((), 0)] * (-len(slots) % shape.batch_prompts)
        requests = [{"prompt_token_ids": list(ids or (self.eos_id,))} for ids, _ in slots]
        sampling = [self._request_params(num_samples, params, row_seed(params.seed, key), shape) for _, key in slots]
        outputs = iter(self.llm.generate(requests, sampling, use_tqdm=False))
        placeholder = Generation("", (), (), False)
        results = []
        for ids in prompt_ids:  # outputs come in request order: skip the dummies
            if not ids:
                if shape is not None:
                    next(outputs)
                results.append([placeholder] * num_samples)
                continue
            results.append([self._generation(ids, completion, shape) for completion in next(outputs).outputs])
        return results

    def _encode(self, prompt: str, room: int) -> tuple[int, ...]:
        """The kept ids of one prompt, or () when it cannot be encoded (never raises)."""
        try:
            ids = [int(token) for token in self.tokenizer(prompt_budget(prompt, room), add_special_tokens=False,
                                                          verbose=False)["input_ids"]]
        except Exception:  # noqa: BLE001 - an untrusted tokenizer's failure is confined to its row
            return ()
        if not all(0 <= token < self.vocab_rows for token in ids):
            return ()
        return tuple(ids[-room:]) if ids else ()

    def _request_params(self, num_samples: int, params: SamplingParams, seed: int, shape: FixedShape | None) -> Any:
        fixed = {"ignore_eos": True, "min_tokens": params.max_new_tokens} if shape is not None else {}
        return self._vllm.SamplingParams(
            n=num_samples,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=seed,
            skip_special_tokens=True,
            **fixed,
        )

    def _generation(self, prompt_ids: tuple[int, ...], completion: Any, shape: FixedShape | None) -> Generation:
        completion_ids = list(completion.token_ids)
        if shape is not None:  # decoded past EOS (ignore_eos): cut as the interface says
            finished = self.eos_id in completion_ids
            if finished:
                completion_ids = completion_ids[: completion_ids.index(self.eos_id) + 1]
            try:
                text = str(self.tokenizer.decode(completion_ids, skip_special_tokens=True))
            except Exception:  # noqa: BLE001 - a decoding failure is confined to its row
                text = ""
            return Generation(text, prompt_ids, tuple(completion_ids), finished)
        finished = completion.finish_reason == "stop"
        if finished and (not completion_ids or completion_ids[-1] != self.eos_id):
            completion_ids.append(self.eos_id)  # the interface counts EOS as generated
        return Generation(completion.text, prompt_ids, tuple(completion_ids), finished)

    def sync_weights(self) -> None:
        """Push the live model's parameters into every vLLM worker (collective_rpc), then drop stale KV."""
        for bucket in weight_buckets(self.model, self.bucket_bytes, self.push_dtype):
            self.llm.collective_rpc(load_weights_on_worker, args=(bucket,))
        self.llm.reset_prefix_cache()


# The dtype weights travel in: the engine's dtype (vLLM would cast on load anyway), so a bf16
# engine moves half the bytes of a float32 trainer; "auto" keeps the trainer's dtype.
PUSH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def weight_buckets(
    model: torch.nn.Module, bucket_bytes: int, dtype: torch.dtype | None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The model's named parameters as detached CPU tensors, in buckets of at most `bucket_bytes`
    (a single larger tensor goes alone). CPU, because the tensors cross vLLM's process boundary."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            tensor = param.detach().to(device="cpu", dtype=dtype or param.dtype)
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += nbytes
    if bucket:
        yield bucket


def load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside each vLLM worker (sent by LLM.collective_rpc, which passes the worker first):
    loads one bucket through the model's own load_weights; returns how many tensors it took."""
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    with torch.no_grad():
        model.load_weights(weights=weights)
    return len(weights)
