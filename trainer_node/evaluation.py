"""Local accuracy of a policy on examples the caller holds (never the owner's data).

Used by `train` on a held-out slice of the source data, and by benchmarks in simulation
mode on the testbed's test split.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from rlvr_core.engines.base import GenerationEngine
from rlvr_core.engines.sampling import row_key
from rlvr_core.scoring import Decoding, ScoreFn, score_rows
from rlvr_core.tasks.example import Example


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

    Scored by `rlvr_core.scoring.score_rows` (the owner's scorer), each row keyed by its id,
    so a row's score does not depend on the chunking. Returns {"accuracy": overall mean,
    "per_domain": {domain: mean}, "n": examples, "samples": k}.
    """
    if not examples:
        return {"accuracy": float("nan"), "per_domain": {}, "n": 0, "samples": samples}
    decoding = Decoding(max_new_tokens=max_new_tokens, samples_per_prompt=samples, temperature=temperature, seed=seed)
    totals: dict[str, list[float]] = defaultdict(list)
    overall: list[float] = []
    for start in range(0, len(examples), chunk_size):
        chunk = list(examples[start : start + chunk_size])
        scores = score_rows(engine, chunk, template, decoding, [row_key(e.id) for e in chunk], score_fn=score)
        for example, value in zip(chunk, scores.tolist()):
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
