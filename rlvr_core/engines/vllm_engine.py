"""vLLM generation engine for GPU runs (name "vllm").

UNVERIFIED: written against vLLM's documented API (LLM, SamplingParams, LLM.generate) and
TRL's colocate-mode weight sync; vLLM is not installed anywhere this project is tested, so
no line below the import guard has ever run. Install with the `gpu` extra
(`pip install -e .[gpu]`) and expect to adjust details for the vLLM version you get.

Design:
- vLLM loads the checkpoint itself from a local directory (`model_path` option, else the
  directory the live model was loaded from), with load_format="safetensors" and
  trust_remote_code=False, like rlvr_core.models.load_policy. The directory is checked with
  check_model_dir first.
- Prompts go in as token ids, left-truncated exactly like TransformersEngine.
- Randomness: each prompt gets its own SamplingParams.seed derived from (params.seed, prompt
  index), so results depend on (weights, prompts, num_samples, params) and two checkpoints
  evaluated with one seed draw the same per-request random streams. vLLM's sampler is not
  the one in sampling.py, so samples differ from TransformersEngine's for the same seed.
- sync_weights() pushes the trainer's live parameters into vLLM's in-process model after each
  optimizer step, as TRL's colocate mode does
  (`llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(...)`), then
  resets the prefix cache so no stale KV blocks are reused. That attribute path exists only
  when the engine runs in this process: TRL passes distributed_executor_backend=
  "external_launcher"; with vLLM V1 you may also need VLLM_ENABLE_V1_MULTIPROCESSING=0.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

import torch

from rlvr_core.engines.base import Generation, GenerationEngine, SamplingParams
from rlvr_core.engines.sampling import validate_params
from rlvr_core.engines.transformers_engine import max_positions
from rlvr_core.models.loading import check_model_dir

VLLM_MISSING_MESSAGE = (
    "the 'vllm' engine needs vLLM, which is not installed; install the gpu extra "
    "(pip install -e '.[gpu]') on a CUDA machine, or use engine 'transformers'"
)


def vllm_available() -> bool:
    """True when the vllm package can be imported (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def request_seed(seed: int, prompt_index: int) -> int:
    """Per-prompt vLLM seed: a hash of (seed, index), so prompts get independent streams."""
    digest = hashlib.sha256(f"{seed}:{prompt_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # non-negative int64


class VLLMEngine(GenerationEngine):
    """Colocated vLLM engine; see the module docstring (unverified)."""

    name = "vllm"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str = "cuda",
        model_path: str | Path | None = None,
        gpu_memory_utilization: float = 0.3,
        dtype: str = "bfloat16",
        **llm_options: Any,
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
        self.llm = vllm.LLM(
            model=str(path.resolve()),
            tokenizer=str(path.resolve()),
            load_format="safetensors",
            trust_remote_code=False,
            dtype=dtype,
            seed=0,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_positions(model),
            **llm_options,
        )

    def generate(self, prompts: list[str], num_samples: int, params: SamplingParams) -> list[list[Generation]]:
        validate_params(params, num_samples)
        if not prompts:
            return []
        room = max_positions(self.model) - params.max_new_tokens
        if room < 1:
            raise ValueError(f"params.max_new_tokens ({params.max_new_tokens}) leaves no room for a prompt")
        encoded = self.tokenizer(list(prompts), add_special_tokens=False, verbose=False)["input_ids"]
        for index, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"prompt at index {index} is empty")
        prompt_ids = [ids[-room:] for ids in encoded]
        requests = [{"prompt_token_ids": ids} for ids in prompt_ids]
        sampling = [
            self._vllm.SamplingParams(
                n=num_samples,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_new_tokens,
                seed=request_seed(params.seed, index),
                skip_special_tokens=True,
            )
            for index in range(len(prompts))
        ]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        results = []
        for ids, output in zip(prompt_ids, outputs):
            group = []
            for completion in output.outputs:
                completion_ids = list(completion.token_ids)
                finished = completion.finish_reason == "stop"
                if finished and (not completion_ids or completion_ids[-1] != self.eos_id):
                    completion_ids.append(self.eos_id)  # the interface counts EOS as generated
                group.append(Generation(completion.text, tuple(ids), tuple(completion_ids), finished))
            results.append(group)
        return results

    def sync_weights(self) -> None:
        """Push the live model's parameters into vLLM (TRL colocate path), then drop stale KV."""
        executor = self.llm.llm_engine.model_executor
        worker = executor.driver_worker
        worker = getattr(worker, "worker", worker)  # newer vLLM wraps the worker once more
        vllm_model = worker.model_runner.model
        with torch.no_grad():
            vllm_model.load_weights((name, param.data) for name, param in self.model.named_parameters())
        self.llm.reset_prefix_cache()
