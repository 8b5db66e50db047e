"""Local accuracy of a policy on examples the caller holds (never the owner's data).

Used by `train` on a held-out slice of the source data, and by benchmarks in simulation
mode on the testbed's test split.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from rlvr_core.engines.base import GenerationEngine, SamplingParams
from rlvr_core.tasks.example import Example

ScoreFn = Callable[[str, Example], float]


def local_accuracy(
    engine: GenerationEngine,
    examples: Sequence[Example],
    template: str,
    max_new_tokens: int,
    samples: int = 1,
    seed: int = 0,
    *,
    temperature: float = 0.0,
    chunk_size: int = 128,
    score: ScoreFn | None = None,
) -> dict[str, Any]:
    """Mean verifier score over `samples` generations per example (greedy by default).

    Returns {"accuracy": overall mean, "per_domain": {domain: mean}, "n": examples, "samples": k}.
    """
    from rlvr_core.tasks.prompting import render_prompt

    if score is None:
        from rlvr_core.verifiers import score_example as score
    if not examples:
        return {"accuracy": float("nan"), "per_domain": {}, "n": 0, "samples": samples}
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=seed)
    totals: dict[str, list[float]] = defaultdict(list)
    overall: list[float] = []
    for start in range(0, len(examples), chunk_size):
        chunk = list(examples[start : start + chunk_size])
        outputs = engine.generate([render_prompt(e.prompt, template) for e in chunk], samples, params)
        for example, generations in zip(chunk, outputs):
            value = sum(float(score(g.text, example)) for g in generations) / len(generations)
            overall.append(value)
            totals[example.domain or "default"].append(value)
    return {
        "accuracy": sum(overall) / len(overall),
        "per_domain": {d: sum(v) / len(v) for d, v in sorted(totals.items())},
        "n": len(overall),
        "samples": samples,
    }


def flatten_accuracy(result: dict[str, Any], prefix: str = "accuracy") -> dict[str, float]:
    """{"accuracy": .., "accuracy/<domain>": ..} for metric logs."""
    flat = {prefix: result["accuracy"]}
    flat.update({f"{prefix}/{d}": v for d, v in result.get("per_domain", {}).items()})
    return flat
