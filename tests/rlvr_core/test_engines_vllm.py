"""VLLMEngine.generate against a fake vLLM (vLLM is not installed here): the per-row seed rule,
placeholder rows, dummies and full-length decoding with a FixedShape."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from rlvr_core.engines.base import FixedShape, Generation, SamplingParams
from rlvr_core.engines.sampling import row_key, row_seed
from rlvr_core.engines.vllm_engine import VLLMEngine
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

    def generate(self, requests, sampling, use_tqdm=False):
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
def policy(tmp_path_factory: pytest.TempPathFactory):
    return load_policy(random_tiny_policy(tmp_path_factory.mktemp("vllm") / "model", TEXTS, max_position=48))


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

