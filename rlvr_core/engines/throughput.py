"""Measure generation throughput of any engine (used by tools/bench_engine.py)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from rlvr_core.engines.base import FixedShape, GenerationEngine, SamplingParams


@dataclass(frozen=True)
class ThroughputReport:
    prompts: int
    samples: int  # prompts x num_samples
    generated_tokens: int  # including EOS tokens
    seconds: float
    prompts_per_s: float
    samples_per_s: float
    tokens_per_s: float

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)


def measure_throughput(
    engine: GenerationEngine,
    prompts: list[str],
    num_samples: int,
    params: SamplingParams,
    shape: FixedShape | None = None,
) -> ThroughputReport:
    """Time one `engine.generate` call (wall clock) and count what it produced.

    generated_tokens counts the kept completion ids (cut after EOS); with a FixedShape the
    engine computes all max_new_tokens steps whatever was kept.
    """
    started = time.perf_counter()
    generations = engine.generate(prompts, num_samples, params, shape=shape)
    seconds = time.perf_counter() - started
    samples = sum(len(group) for group in generations)
    tokens = sum(len(g.completion_ids) for group in generations for g in group)
    return ThroughputReport(
        prompts=len(prompts),
        samples=samples,
        generated_tokens=tokens,
        seconds=round(seconds, 4),
        prompts_per_s=len(prompts) / seconds,
        samples_per_s=samples / seconds,
        tokens_per_s=tokens / seconds,
    )
