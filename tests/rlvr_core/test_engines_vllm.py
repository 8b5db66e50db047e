"""VLLMEngine against a fake vLLM (vLLM cannot be installed here): the per-row seed rule,
placeholder rows, dummies and full-length decoding with a FixedShape, the LLM construction
arguments, and the weight push through `LLM.collective_rpc`. The fakes keep vLLM's documented
method signatures (LLM.generate / collective_rpc / reset_prefix_cache, SamplingParams)."""

from __future__ import annotations

import hashlib
import pickle
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlvr_core.engines.base import FixedShape, Generation, SamplingParams
from rlvr_core.engines.registry import build_engine
from rlvr_core.engines.sampling import row_key, row_seed
from rlvr_core.engines.vllm_engine import VLLMEngine, load_weights_on_worker, weight_buckets
from rlvr_core.models import load_policy, random_tiny_policy

TEXTS = [f"Calculate {a} + {b}.\nAnswer: {a + b}" for a in range(12) for b in range(12)]
PARAMS = SamplingParams(max_new_tokens=4, temperature=1.0, seed=7)


@dataclass
class FakeSamplingParams:
    n: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    skip_special_tokens: bool
    ignore_eos: bool = False
    min_tokens: int = 0


@dataclass
class FakeLLM:
    """Echoes each request: completion s of a request is [first prompt id, s, EOS, 5, 6]."""

    eos_id: int
    calls: list = field(default_factory=list)

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None):
        requests, sampling = prompts, sampling_params
        self.calls.append((requests, sampling))
        outputs = []
        for request, params in zip(requests, sampling):
            ids = [request["prompt_token_ids"][0], 1, self.eos_id, 5, 6][: params.max_tokens]
            kept = ids if params.ignore_eos else ids[: ids.index(self.eos_id)]  # vLLM drops a stop EOS
            completions = [
                SimpleNamespace(token_ids=[kept[0], sample, *kept[2:]], text=f"t{sample}",
                                finish_reason="length" if params.ignore_eos else "stop")
                for sample in range(params.n)
            ]
            outputs.append(SimpleNamespace(outputs=completions))
        return outputs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_tiny_policy(tmp_path_factory.mktemp("vllm") / "model", TEXTS, max_position=48)


@pytest.fixture(scope="module")
def policy(model_dir: Path):
    return load_policy(model_dir)


@pytest.fixture
def engine(policy) -> VLLMEngine:
    model, tokenizer = policy
    engine = object.__new__(VLLMEngine)  # skip __init__: it needs vLLM and CUDA
    engine._vllm = SimpleNamespace(SamplingParams=FakeSamplingParams)
    engine.model, engine.tokenizer = model, tokenizer
    engine.eos_id = int(tokenizer.eos_token_id)
    engine.vocab_rows = int(model.get_input_embeddings().num_embeddings)
    engine.llm = FakeLLM(engine.eos_id)
    return engine


def test_request_seeds_follow_the_row_rule(engine: VLLMEngine) -> None:
    keys = [row_key("a"), row_key("b")]
    engine.generate(["Hi", "Calculate 1 + 2.\nAnswer:"], 2, PARAMS, row_keys=keys)
    _, sampling = engine.llm.calls[-1]
    assert [p.seed for p in sampling] == [row_seed(7, key) for key in keys]
    engine.generate(["Hi", "Calculate 1 + 2.\nAnswer:"], 2, PARAMS)
    _, sampling = engine.llm.calls[-1]
    # Positional keys give the seeds this engine used before row keys existed: sha256("seed:index").
    legacy = [int.from_bytes(hashlib.sha256(f"7:{i}".encode()).digest()[:8], "big") >> 1 for i in range(2)]
    assert [p.seed for p in sampling] == legacy
    assert not any(p.ignore_eos for p in sampling)


def test_dynamic_mode_skips_unencodable_rows(engine: VLLMEngine) -> None:
    results = engine.generate(["Hi", "", "Calculate 1 + 2.\nAnswer:"], 2, PARAMS, row_keys=[1, 2, 3])
    requests, sampling = engine.llm.calls[-1]
    assert len(requests) == 2 and [p.seed for p in sampling] == [row_seed(7, 1), row_seed(7, 3)]
    assert results[1] == [Generation("", (), (), False)] * 2
    hi = tuple(engine.tokenizer("Hi", add_special_tokens=False)["input_ids"])
    assert results[0][1] == Generation("t1", hi, (hi[0], 1, engine.eos_id), True)


def test_fixed_shape_pads_requests_and_decodes_every_step(engine: VLLMEngine) -> None:
    shape = FixedShape(prompt_tokens=6, batch_prompts=4)
    long_prompt = " ".join(f"word{i}" for i in range(40))
    results = engine.generate([long_prompt, "", "Hi"], 2, PARAMS, row_keys=[1, 2, 3], shape=shape)
    requests, sampling = engine.llm.calls[-1]
    assert len(requests) == 4  # 3 rows (the empty one as a dummy) + 1 filler
    assert requests[1] == requests[3] == {"prompt_token_ids": [engine.eos_id]}
    assert all(p.ignore_eos and p.min_tokens == PARAMS.max_new_tokens for p in sampling)
    full = engine.tokenizer(long_prompt, add_special_tokens=False)["input_ids"]
    assert results[0][0].prompt_ids == tuple(full[-6:])
    assert results[1] == [Generation("", (), (), False)] * 2
    completion = results[2][1]
    assert completion.completion_ids == (completion.prompt_ids[0], 1, engine.eos_id) and completion.finished
    assert completion.text == engine.tokenizer.decode(completion.completion_ids, skip_special_tokens=True)
    with pytest.raises(ValueError, match=r"shape\.prompt_tokens"):
        engine.generate(["Hi"], 1, PARAMS, shape=FixedShape(prompt_tokens=45, batch_prompts=1))



class FakeVllmModel:
    """A worker's model: vLLM loads the checkpoint itself, and `load_weights(weights)` takes
    (name, tensor) pairs by HF name (vLLM's model classes map and shard them)."""

    def __init__(self, path: str) -> None:
        self.module, _ = load_policy(Path(path))
        self.loaded: list[str] = []

    def load_weights(self, weights):
        params = dict(self.module.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)  # a KeyError here = a name vLLM would not know
            self.loaded.append(name)
        return set(self.loaded)


class FakeWorker:
    """A vLLM worker as collective_rpc's callables see it: `worker.model_runner.get_model()`."""

    def __init__(self, model: FakeVllmModel) -> None:
        self.model_runner = SimpleNamespace(get_model=lambda: model)


class FakeFullLLM(FakeLLM):
    """vllm.LLM with the documented constructor and worker RPC: `collective_rpc(method,
    timeout=None, args=(), kwargs=None)` runs `method(worker, *args, **kwargs)` on every worker
    and returns their results. The call is pickled first, as it crosses vLLM's process boundary."""

    def __init__(self, model: str, *, tokenizer=None, trust_remote_code=False, dtype="auto", seed=None,
                 gpu_memory_utilization=0.9, tensor_parallel_size=1, **kwargs) -> None:
        self.init_args = dict(model=model, tokenizer=tokenizer, trust_remote_code=trust_remote_code, dtype=dtype,
                              seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                              tensor_parallel_size=tensor_parallel_size, **kwargs)
        super().__init__(eos_id=-1)
        self.workers = [FakeWorker(FakeVllmModel(model)) for _ in range(tensor_parallel_size)]
        self.events: list[str] = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        method, args, kwargs = pickle.loads(pickle.dumps((method, args, kwargs or {})))
        self.events.append("rpc")
        return [method(worker, *args, **kwargs) for worker in self.workers]

    def reset_prefix_cache(self, device=None) -> bool:
        self.events.append("reset_prefix_cache")
        return True


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch):
    import rlvr_core.engines.vllm_engine as module

    fake = SimpleNamespace(LLM=FakeFullLLM, SamplingParams=FakeSamplingParams)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(module, "vllm_available", lambda: True)
    return fake


def built_engine(model_dir: Path, **options) -> VLLMEngine:
    model, tokenizer = load_policy(model_dir)
    return build_engine("vllm", model, tokenizer, device="cuda", model_path=str(model_dir), **options)


def test_llm_is_built_safetensors_only_without_remote_code(fake_vllm, model_dir: Path) -> None:
    engine = built_engine(model_dir, llm_args={"tensor_parallel_size": 2, "enforce_eager": True})
    args = engine.llm.init_args
    assert args["model"] == args["tokenizer"] == str(model_dir.resolve())
    assert args["load_format"] == "safetensors" and args["trust_remote_code"] is False
    assert args["max_model_len"] == 48 and args["dtype"] == "bfloat16" and args["enforce_eager"] is True
    assert "distributed_executor_backend" not in args  # the push no longer needs an in-process worker
    with pytest.raises(ValueError, match="trust_remote_code"):
        built_engine(model_dir, llm_args={"trust_remote_code": True})
    with pytest.raises(ValueError, match="weight_bucket_mb"):
        built_engine(model_dir, weight_bucket_mb=0)


def test_sync_weights_pushes_every_parameter_to_every_worker_then_resets_the_cache(fake_vllm, model_dir) -> None:
    engine = built_engine(model_dir, dtype="float32", llm_args={"tensor_parallel_size": 2})
    with torch.no_grad():
        for param in engine.model.parameters():
            param.add_(torch.randn_like(param))  # an optimizer step the workers have not seen
    engine.sync_weights()
    assert engine.llm.events[-1] == "reset_prefix_cache" and engine.llm.events.count("rpc") >= 1
    trained = dict(engine.model.named_parameters())
    for worker in engine.llm.workers:
        pushed = dict(worker.model_runner.get_model().module.named_parameters())
        assert set(pushed) == set(trained)
        assert all(torch.equal(pushed[name], trained[name]) for name in trained)


def test_a_bf16_engine_receives_bf16_buckets_in_several_calls(fake_vllm, model_dir) -> None:
    engine = built_engine(model_dir, weight_bucket_mb=1)
    engine.bucket_bytes = 4096  # tiny model: force several buckets
    engine.sync_weights()
    calls = engine.llm.events.count("rpc")
    buckets = list(weight_buckets(engine.model, 4096, torch.bfloat16))
    assert calls == len(buckets) > 1
    worker_model = engine.llm.workers[0].model_runner.get_model()
    assert worker_model.loaded == [name for name, _ in engine.model.named_parameters()]


def test_weight_buckets_are_bounded_cpu_and_complete(policy) -> None:
    model, _ = policy
    sizes = {name: p.numel() * 2 for name, p in model.named_parameters()}
    buckets = list(weight_buckets(model, 3000, torch.bfloat16))
    assert [name for bucket in buckets for name, _ in bucket] == list(sizes)
    for bucket in buckets:
        assert all(t.device.type == "cpu" and t.dtype == torch.bfloat16 and not t.requires_grad for _, t in bucket)
        assert len(bucket) == 1 or sum(sizes[name] for name, _ in bucket) <= 3000
    assert [t.dtype for _, t in next(weight_buckets(model, 3000, None))] == [next(model.parameters()).dtype]


def test_worker_function_travels_by_reference_and_loads_through_the_model() -> None:
    assert pickle.loads(pickle.dumps(load_weights_on_worker)) is load_weights_on_worker  # importable by workers
    seen = []
    runner = SimpleNamespace(model=SimpleNamespace(load_weights=lambda weights: seen.extend(weights)))
    weights = [("a", torch.zeros(1))]
    assert load_weights_on_worker(SimpleNamespace(model_runner=runner), weights) == 1 and seen == weights


def test_a_rows_seed_ignores_its_batch_mates_and_position(engine: VLLMEngine) -> None:
    prompts = {row_key(f"r{i}"): f"Calculate {i} + 1.\nAnswer:" for i in range(4)}
    keys = list(prompts)
    engine.generate([prompts[k] for k in keys], 3, PARAMS, row_keys=keys)
    alone = {k: p.seed for k, p in zip(keys, engine.llm.calls[-1][1])}
    order = [keys[2], keys[0]]
    engine.generate([prompts[k] for k in order], 3, PARAMS, row_keys=order, shape=FixedShape(8, 4))
    _, sampling = engine.llm.calls[-1]
    assert [p.seed for p in sampling[:2]] == [alone[k] for k in order]
    assert all(p.n == 3 for p in sampling)  # one request per row: vLLM seeds sample i with seed + i
